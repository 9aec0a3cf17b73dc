"""``edgeqa release show --html``: one self-contained page about a release.

The calibration curve (leave-one-out precision and hit rate against the threshold, the chosen
point marked), what was left out at each stage by reason, the most asked clusters with their
phrasings, and the diff to the parent release. Charts are Plotly figures with plotly.js inlined
once, so the page opens with no network. Every text that came from users (questions, answers)
is HTML-escaped and kept out of the charts' data.
"""

from __future__ import annotations

import html
from typing import Any

from base.manifest import Threshold
from precompute.views import ReleaseDiff, ReleaseView, describe_semantic_tier

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #1d2327; padding: 0 1rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1rem; }
th, td { border-bottom: 1px solid #dde1e4; padding: .3rem .5rem; text-align: left;
         vertical-align: top; }
th { background: #f3f5f6; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #5f6b73; } .answer { max-width: 36rem; white-space: pre-wrap; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _calibration_figure(threshold: Threshold) -> Any:
    import plotly.graph_objects as go

    curve = threshold.curve
    thresholds = [point[0] for point in curve]
    figure = go.Figure()
    figure.add_scatter(
        x=thresholds, y=[point[1] for point in curve], name="precision", mode="lines"
    )
    figure.add_scatter(x=thresholds, y=[point[2] for point in curve], name="hit rate", mode="lines")
    chosen = threshold.value
    figure.add_scatter(
        x=[chosen, chosen],
        y=[threshold.precision, threshold.hit_rate],
        name=f"chosen: threshold {chosen}",
        mode="markers",
        marker={"size": 12, "symbol": "diamond"},
    )
    figure.add_vline(x=chosen, line_dash="dot")
    target = threshold.target_precision
    if target is not None:
        figure.add_hline(y=target, line_dash="dash", annotation_text=f"target {target}")
    figure.update_layout(
        title="Semantic tier: leave-one-out precision and hit rate against the threshold",
        xaxis_title="cosine threshold (at the chosen margin and agreement)",
        yaxis={"range": [0, 1.02]},
        height=420,
        margin={"t": 60, "b": 50, "l": 50, "r": 20},
    )
    return figure


def _exclusions_figure(title: str, counts: dict[str, int]) -> Any:
    import plotly.graph_objects as go

    reasons = sorted(counts, key=lambda r: -counts[r])
    figure = go.Figure(go.Bar(x=[counts[r] for r in reasons], y=reasons, orientation="h"))
    figure.update_layout(
        title=title,
        height=max(220, 40 + 28 * len(reasons)),
        margin={"t": 50, "b": 30, "l": 150, "r": 20},
        yaxis={"autorange": "reversed"},
    )
    return figure


def _table(header: list[str], rows: list[list[str]]) -> str:
    """``rows``: each a list of ready ``<td>``/``<th>`` cells; no header row when ``header`` is
    empty."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if header else ""
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def render_html(shown: ReleaseView, diff: ReleaseDiff | None) -> str:
    """The page for ``show_release``'s view, with ``diff_releases`` (parent -> this) if any."""
    calibration = shown.calibration
    figures = [_calibration_figure(calibration)]
    for title, reasons in (
        ("Log rows left out by mining", shown.excluded.rows),
        ("Clusters left out by generation and build", shown.excluded.clusters),
    ):
        if reasons:
            figures.append(_exclusions_figure(title, reasons))
    charts = [
        figure.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"chart-{i}")
        for i, figure in enumerate(figures)
    ]
    counts = shown.counts
    facts = [
        ["version", _e(shown.version) + (" (current)" if shown.current else "")],
        ["created", _e(shown.created_at)],
        ["parent", _e(shown.parent or "none")],
        ["runner", _e(shown.runner)],
        ["entries", f"{_e(counts.rows)} phrasings, {_e(counts.clusters)} clusters"],
        ["expired now", _e(counts.expired)],
        ["model", _e(shown.answering_model)],
        ["profile", _e(shown.profile.name)],
        ["embedder", _e(shown.embedder.name)],
        ["signed by", _e(shown.signed_by or "unsigned")],
        [
            "decision",
            _e(
                f"{describe_semantic_tier(calibration)}; threshold {calibration.value}, "
                f"margin {calibration.margin}, agreement {calibration.agreement}; "
                f"precision {calibration.precision}, hit rate {calibration.hit_rate}"
            ),
        ],
    ]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>edgeqa release {_e(shown.version)}</title><style>{_STYLE}</style></head>",
        f"<body><h1>Release {_e(shown.version)}</h1>",
        _table([], [[f"<th>{k}</th>", f"<td>{v}</td>"] for k, v in facts]),
        "<h2>Calibration</h2>",
        f"<div class='chart'>{charts[0]}</div>",
        "<h2>Left out, by reason</h2><div class='grid'>",
        "".join(f"<div class='chart'>{c}</div>" for c in charts[1:]) or "<p>Nothing.</p>",
        "</div><h2>Most asked clusters</h2>",
    ]
    cluster_rows = []
    for cluster in shown.top_clusters:
        phrasings = "<br>".join(
            _e(p.question) + (" <span class='muted'>(canonical)</span>" if p.canonical else "")
            for p in cluster.phrasings
        )
        cluster_rows.append(
            [
                f"<td class='n'>{_e(cluster.hits)}</td>",
                f"<td>{phrasings}</td>",
                f"<td class='answer'>{_e(cluster.answer)}</td>",
            ]
        )
    parts.append(_table(["hits", "phrasings", "answer"], cluster_rows))
    parts.append("<h2>Changes from the parent release</h2>")
    if diff is None:
        parts.append("<p class='muted'>No parent release is kept to compare with.</p>")
    else:
        parts.append(
            f"<p>{_e(diff.old)} → {_e(diff.new)}: "
            + ", ".join(
                f"{_e(v)} {_e(k.replace('_', ' '))}" for k, v in diff.counts.model_dump().items()
            )
            + "</p>"
        )
        changes = [
            [f"<td>{sign}</td>", f"<td>{_e(c.question)}</td>"]
            for sign, items in (("added", diff.added), ("dropped", diff.dropped))
            for c in items
        ]
        changes += [["<td>changed</td>", f"<td>{_e(c.question)}</td>"] for c in diff.changed]
        parts.append(_table(["", "cluster (canonical question)"], changes))
    parts.append("</body></html>")
    return "".join(parts)
