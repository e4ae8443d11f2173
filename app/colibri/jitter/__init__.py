"""The routing-jitter lab (Qt-free): run a model under real numerics variants on a fixed token
sequence, find the fragile top-k decisions, measure what a stable-top-k epsilon costs, and
compare the remedies (stable top-k, soft routing, expert caching).

    with Runner.open("model.colibri") as r:          # or Runner(model) on an open Model
        tokens = r.greedy_sequence(prompt_ids, 16)
        report = analyze_jitter(r, tokens)          # JitterReport
        sweep = analyze_epsilon(r, tokens)          # EpsilonReport
        remedies = analyze_remedies(r, tokens)      # RemedyReport
        lab = analyze_lab(r, tokens)                # all three, passes shared: LabReports

Definitions are in colibri.jitter.analysis and colibri.jitter.remedies, the passes in
colibri.jitter.passes; variant spelling in colibri.jitter.variants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from colibri.lazy import lazy_exports

if TYPE_CHECKING:
    from colibri.jitter.analysis import (BASELINE, DEFAULT_EPS, Downstream, EpsilonReport,
                                         EpsilonRow, JitterReport, Run, Runner, margins,
                                         ordered_int, parse_eps, report_json, selection_order,
                                         ulp_bin, ulp_bin_label, ulp_bins)
    from colibri.jitter.passes import (LabReports, analyze_epsilon, analyze_jitter, analyze_lab,
                                       analyze_remedies)
    from colibri.jitter.remedies import Remedy, RemedyReport, RemedyRow, parse_thresholds
    from colibri.jitter.variants import DEFAULT_VARIANTS, Variant, parse_variants

# Each name is imported from its module on first use: the CLI's parser reads
# colibri.jitter.variants alone, without the analysis and the converter it loads.
__getattr__ = lazy_exports(__name__, {
    "colibri.jitter.analysis": (
        "BASELINE", "DEFAULT_EPS", "Downstream", "EpsilonReport", "EpsilonRow", "JitterReport",
        "Run", "Runner", "margins", "ordered_int", "parse_eps", "report_json",
        "selection_order", "ulp_bin", "ulp_bin_label", "ulp_bins"),
    "colibri.jitter.passes": ("LabReports", "analyze_epsilon", "analyze_jitter", "analyze_lab",
                              "analyze_remedies"),
    "colibri.jitter.remedies": ("Remedy", "RemedyReport", "RemedyRow", "parse_thresholds"),
    "colibri.jitter.variants": ("DEFAULT_VARIANTS", "Variant", "parse_variants"),
})


__all__ = ["BASELINE", "DEFAULT_EPS", "DEFAULT_VARIANTS", "Downstream",
           "EpsilonReport", "EpsilonRow", "JitterReport", "LabReports", "Remedy", "RemedyReport",
           "RemedyRow",
           "Run", "Runner", "Variant", "analyze_epsilon", "analyze_jitter", "analyze_lab",
           "analyze_remedies",
           "margins", "ordered_int", "parse_eps", "parse_thresholds", "parse_variants",
           "report_json", "selection_order", "ulp_bin", "ulp_bin_label", "ulp_bins"]
