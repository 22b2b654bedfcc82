"""Retrieval for retrieval-augmented generation (chapter 11): a TF-IDF retriever over passages.

RAG (Lewis et al. 2020) puts the passages most similar to the question into the prompt, so the model
answers from text it was never trained on. The retriever here is classic sparse retrieval: TF-IDF
vectors (scikit-learn), cosine similarity, the k best passages.

    r = TfidfRetriever(passages)
    r.search(["Where does Alice live?"], k=1)      # [[index of the best passage]]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class TfidfRetriever:
    def __init__(self, passages: Sequence[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer

        if not passages:
            raise ValueError("TfidfRetriever: expected at least one passage")
        self.passages = list(passages)
        self.vectorizer = TfidfVectorizer(lowercase=True)
        self.matrix = self.vectorizer.fit_transform(self.passages)          # (P, vocabulary), rows L2-normalised

    def search(self, queries: Sequence[str], k: int = 1) -> list[list[int]]:
        """For each query the indices of the k passages with the highest cosine similarity, best first."""
        scores = (self.vectorizer.transform(list(queries)) @ self.matrix.T).toarray()   # (Q, P)
        return np.argsort(-scores, axis=1, kind="stable")[:, :k].tolist()


__all__ = ["TfidfRetriever"]
