"""The routing-jitter lab in the Inspector: views over colibri.jitter reports and the composite
`QtJitterLab` widget (run on a TaskRunner with progress and cancel)."""

from colibri.inspector.jitter.lab import QtJitterLab
from colibri.inspector.jitter.views import (QtCellLogits, QtEpsilonCurve, QtFlipsVsMargin,
                                            QtJitterHeatmap, QtMarginHeatmap, QtRoutingAB)

__all__ = ["QtCellLogits", "QtEpsilonCurve", "QtFlipsVsMargin", "QtJitterHeatmap", "QtJitterLab",
           "QtMarginHeatmap", "QtRoutingAB"]
