"""The ``--html`` report: one self-contained file (charts embedded as base64 PNGs, inline CSS).

Contents: the run's settings, the per-policy table, a chart of tokens/step and
estimated speedup per policy, a chart of the distribution of accepted lengths
(drafted steps only), and one conversation with every reply token coloured by the
provenance kind of the draft that produced it (grey: the token the target
produced itself at the end of each step). Non-assistant messages are shown
as plain text, cut to :data:`MAX_MESSAGE_CHARS`.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

from hvd_agents.errors import HVDError
from hvd_agents.trace.loader import Conversation
from hvd_agents.trace.replay import HighlightTurn, ReplayResult
from hvd_agents.trace.report import policy_figures
from hvd_agents.trace.stats import TARGET_KIND

MAX_MESSAGE_CHARS = 2000
KIND_COLOURS = {
    TARGET_KIND: "#dddddd",
    "system": "#ffd59e",
    "tool_schema": "#b3e5fc",
    "tool_call_skeleton": "#81d4fa",
    "user": "#c5e1a5",
    "assistant_text": "#e1bee7",
    "assistant_tool_call": "#ce93d8",
    "tool_output": "#ffab91",
    "template": "#fff59d",
    "generated": "#80cbc4",
    "prompt": "#bcaaa4",
    "pld": "#90caf9",
    "arctic": "#a5d6a7",
}
_OTHER_COLOUR = "#f48fb1"
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}
.msg{border-left:4px solid #999;margin:.6em 0;padding:.3em .8em;white-space:pre-wrap;font-family:monospace;
font-size:.85em}.role{font-weight:bold;font-family:system-ui,sans-serif}
.reply span{border-radius:2px}.legend span{display:inline-block;padding:.1em .5em;margin:.15em;border-radius:3px}
"""


def render_html(
    result: ReplayResult,
    verify_cost: float,
    meta: dict[str, Any],
    tokenizer: Any,
    conversation: Conversation | None,
) -> str:
    """The report page as a string.

    Args:
        result: the replay result.
        verify_cost: ``c`` of the cost model.
        meta: settings to show (file, tokenizer, k, ...).
        tokenizer: decodes the highlighted reply tokens.
        conversation: the highlighted conversation (its messages), or None.
    """
    figures = policy_figures(result, verify_cost)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>hvd-agents analyze</title>",
        f"<style>{_CSS}</style></head><body><h1>Trace replay: estimated speedup</h1>",
        _meta_list(meta, result),
        _figures_table(figures),
        _img(_chart_speed(figures), "tokens per step and estimated speedup per policy"),
        _img(_chart_accepted(figures), "distribution of accepted lengths"),
    ]
    if conversation is not None and result.highlight_turns:
        parts.append(_conversation_html(result, conversation, tokenizer))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(path: str, page: str) -> None:
    """Write the page.

    Raises:
        HVDError: the file cannot be written.
    """
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
    except OSError as exc:
        raise HVDError(f"cannot write {path}: {exc}") from exc


def _meta_list(meta: dict[str, Any], result: ReplayResult) -> str:
    items = {**meta, "conversations": result.conversations, "assistant turns": result.turns}
    rows = "".join(f"<li><b>{html.escape(str(k))}</b>: {html.escape(str(v))}</li>" for k, v in items.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.notes)
    return f"<ul>{rows}{notes}</ul>"


def _figures_table(figures: dict[str, dict[str, Any]]) -> str:
    columns = [("requests", "{}"), ("output_tokens", "{}"), ("steps", "{}"), ("tokens_per_step", "{:.2f}"),
               ("pct_steps_drafted", "{:.1f}"), ("mean_accepted_when_drafted", "{:.2f}"),
               ("wasted_tokens", "{}"), ("pct_wasted", "{:.1f}"), ("est_speedup", "{:.2f}x")]
    head = "<tr><th>policy</th>" + "".join(f"<th>{c.replace('_', ' ')}</th>" for c, _ in columns) + "</tr>"
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td>" + "".join(f"<td>{fmt.format(fig[c])}</td>" for c, fmt in columns) + "</tr>"
        for name, fig in figures.items()
    )
    return f"<table>{head}{rows}</table>"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _chart_speed(figures: dict[str, dict[str, Any]]) -> bytes:
    plt = _pyplot()
    names = list(figures)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "tokens_per_step", "tokens / step"), (axes[1], "est_speedup", "est. speedup")):
        values = [figures[n][key] for n in names]
        bars = ax.bar(names, values, color="#5c9bd5")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    return _png(plt, fig)


def _chart_accepted(figures: dict[str, dict[str, Any]]) -> bytes:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for name, fig_data in figures.items():
        hist = {int(k): v for k, v in fig_data["accepted_length_hist"].items()}
        total = sum(hist.values())
        if not total:
            continue
        xs = list(range(max(hist) + 1))
        ax.plot(xs, [hist.get(x, 0) / total for x in xs], marker="o", markersize=3, label=name)
    ax.set_xlabel("accepted draft tokens (drafted steps)")
    ax.set_ylabel("share of drafted steps")
    ax.set_title("accepted length distribution")
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(plt, fig)


def _png(plt, fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return buffer.getvalue()


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f"<p><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></p>"


def _conversation_html(result: ReplayResult, conversation: Conversation, tokenizer: Any) -> str:
    by_index = {t.message_index: t for t in result.highlight_turns}
    used = sorted({k for t in result.highlight_turns for k in t.kinds})
    legend = "".join(f"<span style='background:{_colour(k)}'>{html.escape(k)}</span>" for k in used)
    out = [f"<h2>Conversation {html.escape(conversation.id)} (policy {html.escape(str(result.highlight_policy))})</h2>",
           f"<p class='legend'>draft provenance: {legend}</p>"]
    for index, message in enumerate(conversation.messages):
        role = str(message.get("role"))
        turn = by_index.get(index)
        if turn is not None:
            body = f"<div class='reply'>{_reply_html(turn, tokenizer)}</div>"
        else:
            body = html.escape(_message_text(message))
        out.append(f"<div class='msg'><span class='role'>{html.escape(role)}</span>\n{body}</div>")
    return "\n".join(out)


def _message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = str(content or "")
    if message.get("tool_calls"):
        text += ("\n" if text else "") + str(message["tool_calls"])
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + " [...]"


def _reply_html(turn: HighlightTurn, tokenizer: Any) -> str:
    return "".join(
        f"<span style='background:{_colour(kind)}' title='{html.escape(kind)}'>{html.escape(text)}</span>"
        for text, kind in token_pieces(tokenizer, turn.tokens, turn.kinds)
    )


def token_pieces(tokenizer: Any, tokens: Sequence[int], kinds: Sequence[str]) -> list[tuple[str, str]]:
    """The text of each token with its kind; a token ending inside a character is joined to the next."""
    out: list[tuple[str, str]] = []
    emitted = 0
    pending_kind: str | None = None
    for j, kind in enumerate(kinds):
        text = tokenizer.decode(list(tokens[: j + 1]), skip_special_tokens=False)
        pending_kind = pending_kind or kind
        if text.endswith("\ufffd") and j + 1 < len(tokens):
            continue
        out.append((text[emitted:], pending_kind))
        emitted, pending_kind = len(text), None
    return out


def _colour(kind: str) -> str:
    return KIND_COLOURS.get(kind, _OTHER_COLOUR)
