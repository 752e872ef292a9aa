"""The chart of ``hvd-agents bench-agents --chart FILE.png``: turn latency per arm, accepted-length histogram.

Left: each replayed model call's latency (seconds, log scale) per arm, calls in replay
order, conversations separated by a dotted line. Right: how many draft tokens each
drafting engine arm's steps accepted (steps with a draft), as a share of those steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class ChartData(Protocol):
    """What the chart reads of a run (``hvd_agents.bench.agents.AgentBenchResult`` has it)."""

    arms: list[str]
    kinds: dict[str, str]
    conversations: list[str]
    settings: dict[str, Any]

    def arm_calls(self, arm: str) -> Sequence[Any]:
        """The arm's replayed calls, in replay order."""


def write_chart(result: ChartData, path: str | Path) -> None:
    """Draw the two panels into a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (turns, accepted) = plt.subplots(1, 2, figsize=(14, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    order = [(c.conversation, c.index) for c in result.arm_calls(result.arms[0])]
    position = {key: i for i, key in enumerate(order)}
    for arm in result.arms:
        calls = result.arm_calls(arm)
        style = {"linewidth": 2.5, "color": "black"} if arm == "hvd+reuse" else {"linewidth": 1.2}
        turns.plot([position[(c.conversation, c.index)] for c in calls], [c.latency_s for c in calls],
                   marker="o", markersize=3, label=arm, **style)
    start = 0
    for conversation in result.conversations:
        n = sum(1 for key in order if key[0] == conversation)
        if start:
            turns.axvline(start - 0.5, color="grey", linestyle=":", linewidth=1)
        turns.text(start + (n - 1) / 2, 1.01, conversation, transform=turns.get_xaxis_transform(), ha="center",
                   fontsize=8)
        start += n
    turns.set_yscale("log")
    turns.xaxis.set_major_locator(MaxNLocator(integer=True))
    turns.set_xlabel("model call (replay order)")
    turns.set_ylabel("call latency, s (prefill + decode)")
    turns.legend(fontsize=7, ncol=2)
    turns.grid(True, which="both", alpha=0.3)

    drafting = [arm for arm in result.arms
                if result.kinds[arm] == "engine" and any(c.accepted_lengths for c in result.arm_calls(arm))]
    if drafting:
        counts = {arm: Counter(n for c in result.arm_calls(arm) for n in c.accepted_lengths) for arm in drafting}
        longest = max(max(count) for count in counts.values())
        width = 0.8 / len(drafting)
        for i, arm in enumerate(drafting):
            total = sum(counts[arm].values())
            xs = range(longest + 1)
            accepted.bar([x + i * width - 0.4 + width / 2 for x in xs], [counts[arm][x] / total for x in xs],
                         width=width, label=f"{arm} ({total} steps)")
        accepted.legend(fontsize=7)
    else:
        accepted.text(0.5, 0.5, "no drafting arm", ha="center", transform=accepted.transAxes)
    accepted.set_xlabel("draft tokens accepted in a step")
    accepted.set_ylabel("share of the steps with a draft")
    accepted.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"bench-agents: {', '.join(result.conversations)} ({result.settings['threads']} threads)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
