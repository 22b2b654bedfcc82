"""tformer.utils.plot: the heat-map and curve helpers draw what they are given and reject wrong shapes."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tformer.utils.plot import curves, heads_grid, heatmap  # noqa: E402


def test_heatmap_draws_the_matrix_and_rejects_other_ranks():
    w = torch.softmax(torch.randn(3, 5), -1)
    ax = heatmap(w, x_labels=list("abcde"), title="t")
    np.testing.assert_allclose(ax.images[0].get_array(), w.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
    with pytest.raises(ValueError, match=r"\(T_q, T_k\)"):
        heatmap(torch.ones(2, 3, 4))
    plt.close("all")


def test_heads_grid_one_panel_per_head_and_layer():
    fig = heads_grid(torch.rand(2, 3, 4, 4))                        # 2 layers x 3 heads
    drawn = [ax for ax in fig.axes if ax.images]
    assert len(drawn) == 6 and drawn[4].get_title() == "layer 1 head 1"
    fig = heads_grid(torch.rand(5, 4, 4), ncols=2)                  # 3 rows of 2, one panel switched off
    assert len([ax for ax in fig.axes if ax.images]) == 5
    with pytest.raises(ValueError):
        heads_grid(torch.rand(4, 4))
    plt.close("all")


def test_curves_one_line_per_series_and_length_check():
    ax = curves([1, 2, 4], {"a": [1, 2, 3], "b": [3, 2, 1]}, logx=True, logy=True)
    assert [line.get_label() for line in ax.lines] == ["a", "b"]
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [3, 2, 1])
    with pytest.raises(ValueError, match="has 2 values for 3"):
        curves([1, 2, 3], {"a": [1, 2]})
    plt.close("all")
