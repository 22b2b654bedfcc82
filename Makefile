# tformer: two commands do all the set-up.
#   make lab   create .venv if missing, install, open JupyterLab on notebooks/
#              (as root it adds --allow-root; server options go in LAB_ARGS, e.g.
#               make lab LAB_ARGS="--ip=0.0.0.0 --no-browser --port=8888")
#   make doctor  check this machine: its device, backend parity against float64, what to expect here
#   make test  create .venv if missing, install, run every test (package, graders, notebooks, website)
#   make book  build the course website into build/book/ (open build/book/index.html; Chinese: build/book/zh/)
#   make constraints  upgrade within pyproject.toml's ranges, record the versions in
#              requirements/constraints.txt, run the tests (commit the file if they pass)
#
# Installs use requirements/constraints.txt (the versions the tests last passed with) on the Python it
# was made for (its "# python X.Y" line: CI's); on any other Python, pyproject.toml's ranges, said so.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_VERSION   ?= 2.13.0
TORCH_SPEC      ?= torch==$(TORCH_VERSION)
TORCH_RANGE     ?= torch>=2.4,<3
CONSTRAINTS     := requirements/constraints.txt
CI_PYTHON       := $(shell sed -n 's/^\# python //p' $(CONSTRAINTS) 2>/dev/null)
PYVER           = $$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export TFORMER_SMALL ?= 1
# pytest-xdist workers for `make test` (--dist loadfile: a notebook's cells stay in one worker, in order);
# each notebook and grading test runs single-threaded, so two workers fill a 2-core machine
TEST_WORKERS ?= 2

.PHONY: lab doctor test install torch browser book notebooks solutions grade handout bench term clean constraints

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch first: with an NVIDIA GPU the normal (CUDA) build; without one the CPU build, taken from a
# local wheelhouse if pip is configured with one (find-links) and it holds a +cpu wheel, else from
# PyTorch's CPU index. A plain `pip install torch` on a CPU-only Linux laptop would pull several GB of
# CUDA libraries it cannot use.
# torch is pinned (TORCH_VERSION, no local label: +cpu or +cuXXX is the build) on CI's Python, else its range.
torch: $(PY)
	@spec="$(TORCH_SPEC)"; [ "$(PYVER)" = "$(CI_PYTHON)" ] || spec="$(TORCH_RANGE)"; \
	if $(PY) -c "import torch" 2>/dev/null; then \
	  echo "torch $$($(PY) -c 'import torch; print(torch.__version__)') already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing the CUDA build of torch"; \
	  $(PIP) install "$$spec"; \
	else \
	  echo "no NVIDIA GPU: installing the CPU build of torch"; \
	  if $(PIP) install --quiet --no-index --no-deps "$$spec" 2>/dev/null \
	     && $(PIP) show torch 2>/dev/null | grep -q '^Version: .*+cpu'; then \
	    $(PIP) install --quiet "torch==$$($(PIP) show torch | sed -n 's/^Version: //p')"; \
	  else \
	    $(PIP) uninstall --quiet -y torch 2>/dev/null; \
	    $(PIP) install --timeout 30 --retries 1 --index-url $(TORCH_CPU_INDEX) "$$spec" \
	    || { echo "Could not install torch's CPU build from $(TORCH_CPU_INDEX)."; \
	         echo "Install torch yourself into $(VENV) (https://pytorch.org/get-started), then rerun make."; exit 1; }; \
	  fi; \
	fi

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) requirements/jupyterlab-overrides.json | torch
	@if [ "$(PYVER)" = "$(CI_PYTHON)" ]; then \
	  echo "installing the tested versions ($(CONSTRAINTS), Python $(CI_PYTHON))"; \
	  $(PIP) install --quiet -c $(CONSTRAINTS) -e ".[lab,dev,serve,book,translate]"; \
	else \
	  echo "Python $(PYVER) is not $(CI_PYTHON), which $(CONSTRAINTS) was made for: installing from pyproject.toml's version ranges instead"; \
	  $(PIP) install --quiet -e ".[lab,dev,serve,book,translate]"; \
	fi
	@# JupyterLab opens on the course without its "official Jupyter news" pop-up
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp requirements/jupyterlab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	touch $@

install: $(VENV)/.installed

# Containers, cloud notebooks and CI run as root, where Jupyter refuses to start without --allow-root.
LAB_ARGS  ?=
LAB_ROOT  := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
lab: install
	$(VENV)/bin/jupyter lab $(LAB_ROOT) $(LAB_ARGS) notebooks/

# The website's browser test drives Debian's chromium (Playwright cannot download its own browser here):
# installed from the system's packages when we are root with apt-get; otherwise that one test skips.
browser:
	@if [ -x /usr/lib/chromium/chromium ] || command -v chromium >/dev/null 2>&1; then \
	  echo "chromium found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium (apt-get)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
	  || echo "could not install chromium: the browser test will skip"; \
	else \
	  echo "no chromium and not root: the browser test will skip (sudo apt-get install chromium)"; \
	fi
	@if fc-list :lang=zh 2>/dev/null | grep -q .; then \
	  echo "CJK font found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing a CJK font for the Chinese pages (apt-get install fonts-noto-cjk)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fonts-noto-cjk >/dev/null; } \
	  || echo "could not install fonts-noto-cjk: the Chinese pages' font check will skip"; \
	else \
	  echo "no CJK font and not root: the Chinese pages' font check will skip (sudo apt-get install fonts-noto-cjk)"; \
	fi

# The course website: chapters executed in small mode (learner form), cached in build/book_cache; the Chinese
# site (build/book/zh/) reuses those executions; notebooks/zh/ and README.zh-CN.md are regenerated first.
book: install
	$(PY) -m tools.i18n build
	$(PY) -m tools.book

# Builds the website, then runs the package tests, the grader tests, every notebook (both forms) in small
# mode and the website's browser test. A learner notebook the website build already ran without error
# (same code, same tformer) is not run twice (TFORMER_REUSE_BOOK, see conftest.py).
test: install browser
	@$(PY) -m tools.book; book=$$?; \
	TFORMER_REUSE_BOOK=1 TFORMER_REQUIRE_BOOK=$$([ $$book = 0 ] && echo 1 || echo 0) \
	  $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25; tests=$$?; \
	if [ $$book != 0 ]; then echo "make book failed (its error is above)"; fi; \
	if [ $$tests != 0 ]; then exit $$tests; fi; exit $$book

# Regenerate learner notebooks (stubs) and solution notebooks from their sources in notebooks/src/.
notebooks: install
	$(PY) -m tools.notebooks build

solutions: install
	$(PY) -m tools.notebooks build --solutions --out solutions/

# The command to run first on a new machine (tformer/doctor.py): exit 1 if a check fails.
doctor: install
	$(VENV)/bin/tformer doctor

# Grade every learner notebook in notebooks/ (or GRADE=path): a per-chapter table and grade-report.json.
GRADE ?= notebooks/
grade: install
	$(VENV)/bin/tformer grade $(GRADE)

# What students get, without notebooks/src/ (it holds the solutions): the learner notebooks of the assignment's
# chapters (ASSIGNMENT=week1.toml; default every chapter) in one edition (HANDOUT_LANG=zh), into HANDOUT.
HANDOUT ?= handout/
HANDOUT_LANG ?= en
handout: install
	$(VENV)/bin/tformer handout --out $(HANDOUT) --lang $(HANDOUT_LANG) $(if $(ASSIGNMENT),--assignment $(ASSIGNMENT))

bench: install
	$(PY) benchmarks/bench_core.py

# A teacher's term replayed through the commands as typed (tools/term.py): a few minutes; not part of `make test`.
term: install
	$(PY) -m tools.term

# Move to newer versions: upgrade within pyproject.toml's ranges, record them, run every test on them.
constraints: torch
	$(PIP) install --quiet --upgrade -e ".[lab,dev,serve,book,translate]"
	$(PY) requirements/freeze.py
	touch $(VENV)/.installed
	@$(MAKE) --no-print-directory test \
	  || { echo "the tests failed with the versions now in $(CONSTRAINTS): fix them, or git checkout $(CONSTRAINTS)"; exit 1; }

clean:
	rm -rf $(VENV) .pytest_cache solutions build handout

# Every capstone's CPU tier (GPU tier on CUDA), one after another in chapter order, into runs/capstone-NAME;
# resumable. TFORMER_SMALL does not apply: a capstone is its CPU (or GPU) tier by definition.
capstones: install
	@echo "make capstones: the CPU/GPU tier of every capstone (TFORMER_SMALL is ignored)"
	for name in $$($(PY) -c "from tformer.capstones import CAPSTONES; print(*CAPSTONES)"); do \
	  $(VENV)/bin/tformer capstone $$name || exit $$?; done
