"""A workflow's steps drawn as a DAG in plain SVG, server-side: layered by depth (a step's
layer is one more than its deepest parent's), left to right, edges from parent to child.

Bounded whatever the workflow's size: a layer draws at most ``LAYER_CAP`` steps and the
rest of it as one summary box with counts per state; at most ``MAX_LAYERS`` layers are
drawn (the deeper ones share one box), and ``NODE_BUDGET`` steps in all. A 10,000-step
fan-out is a few dozen boxes, not 10,000.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from markupsafe import Markup

# The states a step is drawn in, in the legend's order ("running": an enqueued step whose
# job is running now; the table stores it as enqueued).
STATES = ("blocked", "enqueued", "running", "succeeded", "failed", "cancelled")
LAYER_CAP = 50
MAX_LAYERS = 30
NODE_BUDGET = 400
MAX_EDGES = 3000

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 168, 34, 56, 10, 8
LINE_H = 14  # a summary box's line per state


@dataclass
class Node:
    key: str  # the step's id, or "more-<layer>" for a summary box
    x: float
    y: float
    h: float
    state: str = ""
    actor: str = ""
    args: str = ""  # the start of its arguments as JSON ("[]": none)
    linked: bool = False  # the step has a job (blocked ones never had one)
    counts: dict[str, int] = field(default_factory=dict)  # a summary box's steps per state
    label: str = ""


@dataclass
class Graph:
    nodes: list[Node]
    edges: list[tuple[str, str]]
    width: float
    height: float
    steps: int
    drawn: int
    layers: int
    edges_left_out: int


def depths(steps: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each step's layer. Steps come in the order added, and ``add`` takes only parents
    already added, so one pass in that order sees every parent before its children."""
    out: dict[str, int] = {}
    for s in steps:
        out[s["id"]] = 1 + max((out[p] for p in s["parents"] if p in out), default=-1)
    return out


def layout(steps: Sequence[dict[str, Any]]) -> Graph:
    """Place the steps (dicts with id, actor, state, parents, linked), collapsing what is
    past the caps into summary boxes."""
    depth = depths(steps)
    layers: list[list[dict[str, Any]]] = []
    for s in steps:
        d = depth[s["id"]]
        while len(layers) <= d:
            layers.append([])
        layers[d].append(s)

    # what each column holds: (steps drawn one by one, steps summed in a box, the box's label)
    columns: list[tuple[list[dict[str, Any]], list[dict[str, Any]], str]] = []
    budget = NODE_BUDGET
    for i, layer in enumerate(layers[:MAX_LAYERS]):
        shown = layer[:max(0, min(LAYER_CAP, budget))]
        budget -= len(shown)
        rest = layer[len(shown):]
        columns.append((shown, rest, f"+{len(rest)} more in layer {i + 1}"))
    if len(layers) > MAX_LAYERS:
        deep = [s for layer in layers[MAX_LAYERS:] for s in layer]
        columns.append(([], deep, f"{len(deep)} steps in layers {MAX_LAYERS + 1}–{len(layers)}"))

    def column_height(shown: list[Any], rest: list[Any]) -> float:
        h: float = len(shown) * (NODE_H + GAP_Y)
        if rest:
            h += _summary_height(rest) + GAP_Y
        return h - GAP_Y if h else 0

    tallest = max((column_height(shown, rest) for shown, rest, _ in columns), default=0)
    nodes: list[Node] = []
    node_of: dict[str, str] = {}
    for c, (shown, rest, label) in enumerate(columns):
        x = PAD + c * (NODE_W + GAP_X)
        y = PAD + (tallest - column_height(shown, rest)) / 2  # centred: a diamond looks like one
        for s in shown:
            nodes.append(Node(s["id"], x, y, NODE_H, state=s["state"], actor=s["actor"], args=s.get("args") or "",
                              linked=s["linked"]))
            node_of[s["id"]] = s["id"]
            y += NODE_H + GAP_Y
        if rest:
            key = f"more-{c}"
            nodes.append(Node(key, x, y, _summary_height(rest), counts=_counts(rest), label=label))
            for s in rest:
                node_of[s["id"]] = key

    edges: dict[tuple[str, str], None] = {}  # ordered and deduplicated: many steps into one box is one edge
    left_out = 0
    for s in steps:
        for p in s["parents"]:
            pair = (node_of.get(p, ""), node_of[s["id"]])
            if not pair[0] or pair[0] == pair[1] or pair in edges:
                continue
            if len(edges) >= MAX_EDGES:
                left_out += 1
                continue
            edges[pair] = None
    width = PAD * 2 + max(len(columns), 1) * (NODE_W + GAP_X) - GAP_X
    return Graph(nodes, list(edges), width, PAD * 2 + tallest, len(steps),
                 sum(len(shown) for shown, _, _ in columns), len(layers), left_out)


def _counts(steps: Iterable[dict[str, Any]]) -> dict[str, int]:
    found = Counter(s["state"] for s in steps)
    return {state: found[state] for state in STATES if found[state]}


def _summary_height(steps: list[dict[str, Any]]) -> float:
    return 22 + LINE_H * len(_counts(steps))


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def svg(graph: Graph, title: str) -> Markup:
    """The graph as an SVG element: each step a box in its state's colour (and named: the
    state is written in the box, not told by colour alone), linked to its job's page."""
    by_key = {n.key: n for n in graph.nodes}
    out = [f'<svg class="wf-graph" xmlns="http://www.w3.org/2000/svg" width="{graph.width:.0f}" '
           f'height="{graph.height:.0f}" viewBox="0 0 {graph.width:.0f} {graph.height:.0f}" role="group" '
           f'aria-label="{escape(title)}">',
           '<defs><marker id="wf-arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L8,4 L0,8 z" class="wf-arrow"/></marker></defs>']
    for a, b in graph.edges:
        p, c = by_key[a], by_key[b]
        x1, y1, x2, y2 = p.x + NODE_W, p.y + p.h / 2, c.x, c.y + c.h / 2
        mid = (x1 + x2) / 2
        out.append(f'<path class="wf-edge" data-from="{escape(a)}" data-to="{escape(b)}" '
                   f'd="M{x1:.0f},{y1:.1f} C{mid:.0f},{y1:.1f} {mid:.0f},{y2:.1f} {x2 - 1:.0f},{y2:.1f}" '
                   'marker-end="url(#wf-arrow)"/>')
    for n in graph.nodes:
        out.append(_summary(n) if n.counts else _step(n))
    out.append("</svg>")
    return Markup("".join(out))


def _step(n: Node) -> str:
    called = n.actor + (f" {n.args}" if n.args not in ("", "[]") else "")
    name = f"{called}: {n.state}"
    box = (f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="4" class="wf-box"/>'
           f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="6" height="{NODE_H}" rx="2" class="wf-band"/>'
           f'<text x="{n.x + 12:.0f}" y="{n.y + 14:.0f}" class="wf-actor">{escape(_short(called, 24))}</text>'
           f'<text x="{n.x + 12:.0f}" y="{n.y + 28:.0f}" class="wf-state">{n.state}</text>'
           f"<title>{escape(name)} (step {escape(n.key)})</title>")
    attrs = f'class="wf-step {n.state}" data-step="{escape(n.key)}" data-state="{n.state}"'
    if n.linked:
        # named by its visible text (actor, arguments, state): a label of its own would differ
        return f'<a href="/jobs/{escape(n.key)}" {attrs}>{box}</a>'
    return f'<g {attrs}>{box}</g>'


def _summary(n: Node) -> str:
    lines = "".join(
        f'<rect x="{n.x + 10:.0f}" y="{n.y + 22 + i * LINE_H:.0f}" width="9" height="9" class="wf-key {state}"/>'
        f'<text x="{n.x + 24:.0f}" y="{n.y + 31 + i * LINE_H:.0f}" class="wf-count" data-state="{state}">'
        f"{state} {count}</text>"
        for i, (state, count) in enumerate(n.counts.items()))
    told = ", ".join(f"{count} {state}" for state, count in n.counts.items())
    return (f'<g class="wf-summary" data-summary="{escape(n.key)}">'
            f'<rect x="{n.x:.0f}" y="{n.y:.0f}" width="{NODE_W}" height="{n.h:.0f}" rx="4" class="wf-box"/>'
            f'<text x="{n.x + 10:.0f}" y="{n.y + 15:.0f}" class="wf-actor">{escape(n.label)}</text>'
            f"{lines}<title>{escape(n.label)}: {escape(told)}</title></g>")
