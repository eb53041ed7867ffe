"""The report's plots as a reader sees them: curves that agree both stay visible, no legend lies
under a reference line, log axes read as plain numbers. Each check reads the drawn figure back
(matplotlib's own artists and pixel extents), not the plotting code.

    python -m pytest tests/icl_eval/test_report_plots.py -q
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from evalm.icl_eval import report  # noqa: E402

SHOTS = ["0", "4", "16", "64"]
BASELINES = {"chance": {"mean": 0.25}, "test_majority": {"mean": 0.43}, "in_context_majority": {"mean": 0.3}}


def _cells(acc: list[float], ms: list[float]) -> dict:
    return {k: {"accuracy_mean": a, "accuracy_ci95": [a - 0.1, a + 0.1], "baselines": BASELINES,
                "seconds_per_item_mean": t / 1e3} for k, a, t in zip(SHOTS, acc, ms)}


@pytest.fixture
def figures(monkeypatch):
    """Every figure the plotting code makes, kept open (savefig still writes the file)."""
    made = []
    monkeypatch.setattr(plt, "close", lambda fig=None: made.append(fig))
    return made


def _screen_x(line) -> np.ndarray:
    return line.get_transform().transform(np.column_stack(line.get_data()))[:, 0]


def test_equal_curves_are_drawn_side_by_side_with_their_own_markers(tmp_path, figures):
    same = [0.3, 0.5, 0.8, 1.0]  # incremental == concat, as by construction
    summary = {"test": {"incremental": _cells(same, [5.2, 5.7, 6.3, 7.0]), "concat": _cells(same, [5.2, 6.0, 7.0, 9.0])}}
    report.plot_accuracy({"": summary}, tmp_path / "acc.png", "t")
    ax = figures[-1].axes[0]
    inc, con = (next(l for l in ax.get_lines() if l.get_label() == m) for m in ("incremental", "concat"))
    assert np.array_equal(inc.get_ydata(), con.get_ydata())  # the data are untouched ...
    assert np.all(np.abs(_screen_x(inc) - _screen_x(con)) >= 3)  # ... and drawn apart on screen (pixels)
    assert (inc.get_marker(), inc.get_linestyle()) != (con.get_marker(), con.get_linestyle())


def test_time_axis_reads_as_plain_numbers(tmp_path, figures):
    summary = {"test": {"incremental": _cells([0.3] * 4, [5.2, 5.7, 6.3, 7.0])}}
    report.plot_time(summary, tmp_path / "time.png", "t")
    ax = figures[-1].axes[0]
    labels = [t.get_text() for t in [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)] if t.get_text()]
    assert labels and not any("10^" in t or "times" in t for t in labels), labels
    assert "6" in labels or "5" in labels, labels


def _ppl(scale: float) -> dict:
    buckets = [{"bucket": [2 ** (i - 1), 2 ** i], "token_ppl": scale * (1.1 - 0.02 * i)} for i in range(10, 16)]
    return {"protocols": {"cached": {"buckets": buckets}},
            "references": {"uniform": {"overall": {"token_ppl": 1024.0}}, "unigram": {"overall": {"token_ppl": 370.8}}}}


def test_the_perplexity_legend_is_clear_of_the_reference_lines(tmp_path, figures):
    report.plot_perplexity({"EVA pretrained": _ppl(133), "EVA tuned": _ppl(117)}, tmp_path / "ppl.png", "t")
    fig = figures[-1]
    fig.canvas.draw()
    ax = fig.axes[0]
    box = ax.get_legend().get_window_extent()
    for line in ax.get_lines():
        if line.get_label().endswith("reference (1024)") or line.get_label().endswith("reference (371)"):
            y = ax.transData.transform((1, line.get_ydata()[0]))[1]
            assert not box.y0 <= y <= box.y1, (line.get_label(), box, y)
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert not any("10^" in t for t in labels), labels
