"""The Corpus view: a `colibri profile` directory (colibri.profile.results) in the Inspector,
and two profiles compared as differences."""

from colibri.inspector.corpus.view import QtCorpusView
from colibri.inspector.corpus.views import (QtExpertDetail, QtFlipRate, QtMarginHistogram,
                                            QtMatrixHeatmap)

__all__ = ["QtCorpusView", "QtExpertDetail", "QtFlipRate", "QtMarginHistogram",
           "QtMatrixHeatmap"]
