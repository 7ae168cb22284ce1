"""HTML for the page: the panes (two, or one lane per run in a race of every method), the summary, the step-by-step
tree and explanation, the bench bars.  It reads the race record only: labels, plot colours and draft sources come
in the record's lane styles, so a newly registered drafter renders with its own names and colours."""
from __future__ import annotations

import html

from specdemo.app.record import AR, RaceRecord, groups_of
from specdemo.app.tree_svg import tree_svg
from specdemo.metrics import Summary

OWN_STYLE = ("own", "the target's own", "#fef3c7", "#713f12")  # how the target's own tokens look by source


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _source_colours(rec: RaceRecord, lane: str) -> dict[str, tuple[str, str]]:
    """Source name -> (light, dark) colours of the lane's declared sources and of the target's own tokens."""
    return {name: (light, dark) for name, _, light, dark in (OWN_STYLE, *rec.styles[lane].sources)}


def _source_attrs(styles: dict[str, tuple[str, str]], source: str | None) -> str:
    """data-src and the source's colours as CSS variables, which the page's "colour by source" switch shows; a source
    the lane's drafter did not declare shows as a plain accepted draft."""
    name = source or "draft"
    if name not in styles:
        return ' data-src="draft"'
    light, dark = styles[name]
    return f' data-src="{_esc(name)}" style="--sd-src-light:{light};--sd-src-dark:{dark}"'


def spans_html(rec: RaceRecord, key: str) -> str:
    """The run's text as escaped spans: accepted drafts shaded by step parity, the target's own tokens plain; every
    span also names its source (data-src), which the page's "colour by source" switch shows instead."""
    run, styles = rec.runs[key], _source_colours(rec, key)
    out = []
    for p in groups_of(rec.pieces[key]):
        if not p.text:
            continue
        ev = run.events[p.step]
        text = _esc(p.text)
        if key == AR:
            out.append(text)
        elif p.from_draft:
            tip = (f"step {p.step + 1} · accepted {ev.accepted} of {ev.tree_size} drafted · "
                   f"source: {p.source or 'draft'}")
            out.append(f'<span class="sd-acc sd-s{p.step % 2}" data-step="{p.step + 1}"'
                       f'{_source_attrs(styles, p.source)} title="{_esc(tip)}">{text}</span>')
        else:
            tip = (f"step {p.step + 1} · the target's own token · accepted {ev.accepted} of {ev.tree_size} drafted"
                   if ev.tree_size else f"step {p.step + 1} · the target's own token · nothing was drafted")
            out.append(f'<span class="sd-own" data-step="{p.step + 1}"{_source_attrs(styles, "own")} '
                       f'title="{_esc(tip)}">{text}</span>')
    return "".join(out)


STEP_LEGEND = ('<div class="sd-legend sd-legend-step"><span class="sd-acc sd-s0">accepted</span><span '
               'class="sd-acc sd-s1">draft</span> tokens (shade alternates per step) · plain = the target\'s own '
               'token · hover for details</div>')


def legend_html(rec: RaceRecord, lanes: list[str]) -> str:
    """Both legends (the page's colour switch shows one): by step, and by the sources of `lanes`' drafters."""
    seen = {}
    for lane in lanes:
        for name, label, light, dark in rec.styles[lane].sources:
            seen.setdefault(name, (label, light, dark))
    seen.setdefault(OWN_STYLE[0], OWN_STYLE[1:])
    items = "".join(f'<span data-src="{_esc(n)}" style="--sd-src-light:{light};--sd-src-dark:{dark}">{_esc(label)}'
                    f'</span>' for n, (label, light, dark) in seen.items())
    return f'{STEP_LEGEND}<div class="sd-legend sd-legend-source">{items} · hover for details</div>'


def pane_html(rec: RaceRecord | None, key: str) -> str:
    """One side of the race: title, live stats, a progress bar and the streamed text."""
    title = rec.label(key) if rec and key in rec.runs else ("Autoregressive" if key == AR else "Speculative")
    badge = "baseline · one token per forward" if key == AR else "speculative · drafts verified in one forward"
    if rec is None or key not in rec.runs or (rec.status == "error" and not rec.runs[key].events):
        body = '<span class="sd-placeholder">Press Generate to start the race.</span>'
        stats = ""
        pct = 0.0
    else:
        run = rec.runs[key]
        pct = 100.0 * run.n_tokens / max(1, rec.request.max_new_tokens)
        state = ("done" if run.done else "racing…" if rec.active else rec.status)
        stats = (f'<span><b>{run.n_tokens}</b> tokens</span><span><b>{run.compute_s:.2f} s</b> compute</span>'
                 f'<span><b>{run.tokens_per_s:.1f}</b> tok/s</span><span><b>{run.forwards}</b> forwards</span>'
                 f'<span class="sd-state">{state}</span>')
        body = spans_html(rec, key) or '<span class="sd-placeholder">…</span>'
        if run.done:
            pct = 100.0
    legend = legend_html(rec, [key]) if rec and key in rec.runs and key != AR and not rec.request.race_all else ""
    return (f'<div class="sd-pane sd-pane-{key}"><div class="sd-pane-head"><span class="sd-pane-title">{_esc(title)}'
            f'</span><span class="sd-badge">{badge}</span></div><div class="sd-stats">{stats}</div>'
            f'<div class="sd-bar"><div style="width:{pct:.1f}%"></div></div>{legend}'
            f'<div class="sd-scroll"><div class="sd-text">{body}</div></div></div>')


def summary_html(rec: RaceRecord | None, update: str | None = None, drawn: int = 0, plots: bool = False) -> str:
    """Speedup, τ, forwards saved and the identical-output check; live while racing, final at the end.

    `update` is the token the page acknowledges once it has drawn this update (app/clocks/drawn.py), `plots` says that
    the update redraws the charts too (the page then waits for them before acknowledging); `drawn` counts the race's
    updates acknowledged so far."""
    ack = (f' data-update="{update}"' + (' data-plots="1"' if plots else "")) if update else ""
    if rec is None or not rec.summaries:
        # what the race will report, not how it runs: the paragraph beside the prompt says that
        return (f'<div class="sd-summary sd-muted"{ack}>The speedup, τ, the target forwards saved and whether both '
                'outputs are identical appear here as the race runs.</div>')
    if rec.request.race_all:
        return _board_summary_html(rec, ack, drawn)
    s = rec.summaries[rec.chosen_lane()]
    final = not rec.active
    note = _progress_word(rec)
    speed = "–" if s.speedup is None else f"{s.speedup:.2f}×"
    ident_cls = "sd-ok" if s.identical else "sd-bad"
    if s.identical:
        ident = "✓ identical" if s.complete else "✓ identical so far"
    else:
        ident = f"✗ differ at token {_difference(s)}"
    cards = [
        ("Speedup", speed, f"tokens/s vs autoregressive ({note})", "sd-big" if final else ""),
        ("τ", f"{s.tau:.2f}", "tokens per target forward", ""),
        ("Forwards saved", f"{s.forwards_saved}", f"{s.baseline_forwards} → {s.forwards} target forwards", ""),
        ("Outputs", ident, _esc(rec.caveat) or "token lists compared", ident_cls),
    ]
    inner = _cards_html(cards)
    wall, other = rec.wall_s, rec.other_s
    clock = _clock_html(rec)
    data = (f'data-status="{rec.status}" data-speedup="{s.speedup or 0:.4f}" '
            f'data-ar-tps="{rec.runs["ar"].tokens_per_s:.4f}" data-wall-s="{wall:.3f}" data-page-s="{other:.3f}" '
            f'data-drawn="{drawn}"{ack}')
    return f'<div class="sd-summary" {data}>{inner}{clock}</div>'


def _difference(s: Summary) -> str:
    """Where a run first left AR's tokens and, where AR chose that token, how near a tie it was: a gap of a few
    hundredths between the target's two best logits is a flip of rounding (reduced precision, other kernels); a large
    gap is not."""
    if s.tie_gap is None:
        return f"{s.first_difference}"
    return f'{s.first_difference} <span class="sd-gap">(top-2 logit gap {s.tie_gap:.3g})</span>'


def _progress_word(rec: RaceRecord) -> str:
    return "final" if rec.status == "done" else ("so far" if rec.active else rec.status)


def _cards_html(cards: list[tuple[str, str, str, str]]) -> str:
    """Summary cards from (label, value, note, extra class)."""
    return "".join(f'<div class="sd-card {cls}"><div class="sd-card-label">{k}</div><div class="sd-card-value">{v}'
                   f'</div><div class="sd-card-note">{n}</div></div>' for k, v, n, cls in cards)


def _clock_html(rec: RaceRecord) -> str:
    wall, other = rec.wall_s, rec.other_s
    return (f'<div class="sd-clock">wall {wall:.2f} s: decoding {wall - other:.2f} s · page and bookkeeping '
            f'{other:.2f} s ({100 * other / wall:.0f}%), not charged to any run</div>{_costs_html(rec)}'
            if wall > 0 else "")


def _costs_html(rec: RaceRecord) -> str:
    """After a race, what a verification costs here in plain steps: a speedup is τ over the cost of the steps that
    earn it, and where the products are compute-bound (4-bit weights on a CPU) each drafted row costs almost a step."""
    if rec.active or not rec.verify_costs:
        return ""
    costs = " · ".join(f"{n} drafts {c:.2f} plain steps" for n, c in rec.verify_costs.items())
    where = f"{rec.device}, {rec.precision}" if rec.device == "cpu" else rec.device
    return (f'<div class="sd-clock">cost of one verifying forward here ({_esc(where)}): {costs} — why the speedup '
            'stays below τ</div>')


def _board_summary_html(rec: RaceRecord, ack: str, drawn: int) -> str:
    """A race all's summary cards: the fastest lane, the lanes still racing, and whether every output matches AR."""
    note = _progress_word(rec)
    best = rec.chosen_lane()
    s = rec.summaries[best]
    identical = all(x.identical for x in rec.summaries.values())
    racing = sum(not r.done for r in rec.runs.values())
    cards = [
        ("Fastest", rec.label(best), f"{s.speedup or 0:.2f}× vs autoregressive ({note})",
         "sd-big" if not rec.active else ""),
        ("Lanes", f"{len(rec.runs)}", f"{racing} still racing" if racing else "all finished", ""),
        ("Best τ", f"{max(rec.runs[k].tau for k in rec.method_lanes):.2f}", "tokens per target forward", ""),
        ("Outputs", "✓ all identical" if identical else "✗ some differ",
         _esc(rec.caveat) or "every lane vs autoregressive", "sd-ok" if identical else "sd-bad"),
    ]
    inner = _cards_html(cards)
    data = (f'data-status="{rec.status}" data-lanes="{len(rec.runs)}" data-identical="{int(identical)}" '
            f'data-wall-s="{rec.wall_s:.3f}" data-page-s="{rec.other_s:.3f}" data-drawn="{drawn}"{ack}')
    return f'<div class="sd-summary" {data}>{inner}{_clock_html(rec)}</div>'


def lanes_html(rec: RaceRecord | None) -> str:
    """Race all: the finishing board (ranked by tokens/s) over one lane per run, each streaming its text."""
    if rec is None or not rec.request.race_all:
        return ""
    rows = []
    ranked = sorted(rec.runs, key=lambda k: -rec.runs[k].tokens_per_s)
    for place, key in enumerate(ranked, 1):
        run, s = rec.runs[key], rec.summaries.get(key)
        draft = sum(e.draft_s for e in run.events)
        pct = 100 * draft / run.compute_s if run.compute_s else None
        share = "–" if pct is None else f"{pct:.0f}% / {100 - pct:.0f}%"
        same = "–" if s is None else ("✓" if s.identical else f"✗ at {_difference(s)}")
        speedup = 1.0 if key == "ar" else s.speedup if s else None
        speed = "–" if speedup is None else f"{speedup:.2f}×"
        rows.append(f'<tr data-lane="{key}" data-tps="{run.tokens_per_s:.4f}" '
                    f'data-speedup="{speedup or 0:.4f}"><td>{place}</td><td>{_esc(rec.label(key))}</td>'
                    f'<td>{run.tokens_per_s:.1f}</td><td><b>{speed}</b></td><td>{run.tau:.2f}</td><td>{same}</td>'
                    f'<td>{share}</td><td>{run.forwards}</td><td>{"done" if run.done else "racing…"}</td></tr>')
    board = ('<table class="sd-board"><thead><tr><th>#</th><th>run</th><th>tok/s</th><th>speedup</th><th>τ</th>'
             '<th>identical</th><th>draft / verify</th><th>forwards</th><th></th></tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table>')
    skipped = "".join(f'<div class="sd-mode-off"><b>{_esc(label)}</b> not raced: {_esc(why)}</div>'
                      for label, why in rec.skipped.items())
    lanes = "".join(f'<div class="sd-lane" data-lane="{k}">{pane_html(rec, k)}</div>' for k in rec.runs)
    return (f'<div class="sd-lanes">{board}<div class="sd-modes">{skipped}</div>{legend_html(rec, rec.method_lanes)}'
            f'<div class="sd-lane-grid">{lanes}</div></div>')


def message_html(text: str | None, kind: str = "error") -> str:
    if not text:
        return ""
    return f'<div class="sd-msg sd-msg-{kind}">{_esc(text)}</div>'


def header_html(model: str | None, error: str | None = None) -> str:
    """The title and the loaded model's description (`Target.describe()`), or why none is loaded."""
    chip = (f'<span class="sd-chip">{_esc(model)}</span>' if model
            else f'<span class="sd-chip sd-chip-bad">{_esc(error or "no model loaded")}</span>')
    return (f'<div class="sd-header"><div><h1>specdemo <span>· speculative decoding, made visible</span></h1>'
            f'<p>A small model drafts, the big one checks many tokens in one pass: same output, fewer passes. '
            f'Race it against plain decoding and watch every step.</p></div>{chip}</div>')


def modes_html(avail: dict[str, str | None], labels: dict[str, str]) -> str:
    """The modes that cannot run on this model, each with its reason (and the command that fixes it)."""
    off = [m for m, why in avail.items() if why and ":" not in m]
    rows = [f'<div class="sd-mode-off"><b>{_esc(labels.get(m, m))}</b> {_esc(avail[m])}</div>' for m in off]
    # grey out and disable those choices in the radio above (its inputs carry the method as their value)
    style = "".join(f'#sd-mode label:has(input[value="{m}"]) {{ opacity: .45; pointer-events: none; '
                    f'border-style: dashed; }}' for m in off)
    return f'<style>{style}</style><div class="sd-modes">{"".join(rows)}</div>' if rows else ""


def _root_token(rec: RaceRecord, k: int, lane: str) -> int | None:
    """The newest committed token before step k of `lane` (the tree hangs off it)."""
    for ev in reversed(rec.runs[lane].events[:k]):
        if ev.tokens:
            return ev.tokens[-1]
    return rec.prompt_tail[-1] if rec.prompt_tail else None


TREE_LEGEND = ('<div class="sd-tree-legend"><span class="sd-node sd-n-root">root</span>'
               '<span class="sd-node sd-n-acc">accepted</span><span class="sd-node sd-n-rej">rejected here</span>'
               '<span class="sd-node sd-n-other">not reached</span><span class="sd-node sd-n-probe">probe</span>'
               '<span class="sd-node sd-n-own">★ target\'s own</span>'
               '<span class="sd-tree-note">a number in a box is the drafter\'s own estimate that the node gets '
               'accepted · hover a node for its source</span></div>')


def tree_html(rec: RaceRecord, k: int, lane: str) -> str:
    """The verified tree of step k, drawn (tree_svg): accepted path green, the drafts the target rejected red, its
    own token starred, probes dashed, each node's source and score in its tooltip."""
    ev = rec.runs[lane].events[k]
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    svg = tree_svg(ev.tree, ev.accepted_nodes, own, _root_token(rec, k, lane), rec.token_text)
    return f'<div class="sd-tree">{TREE_LEGEND}<div class="sd-tree-scroll">{svg}</div></div>'


def explain_step(rec: RaceRecord, k: int, lane: str) -> str:
    """Plain-language account of step k of a speculative lane (markdown)."""
    ev = rec.runs[lane].events[k]
    label = rec.label(lane)
    tt = rec.token_text
    q = lambda toks: "“" + "".join(tt.get(t, "") for t in toks).replace("\n", "↵") + "”"  # noqa: E731
    n, d, a = len(ev.tokens), ev.tree_size, ev.accepted
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    first = " (this first step also includes reading the prompt)" if k == 0 else ""
    timing = f"Drafting took {1e3 * ev.draft_s:.0f} ms and the check {1e3 * ev.verify_s:.0f} ms{first}."
    parts = [f"**Step {k + 1} of {len(rec.runs[lane].events)}.**"]
    if d == 0:
        parts.append(f"The {label} drafter had no guess this time, so the target model ran one ordinary forward "
                     f"pass and wrote one token, {q(ev.tokens)} — exactly what plain decoding does.")
    else:
        leaves = sum(1 for i in range(d) if i not in set(ev.tree.parents))
        shape = "a chain" if leaves == 1 else f"a tree with {leaves} branches"
        srcs = sorted({s for s in (ev.tree.sources or []) if s})
        parts.append(f"The {label} drafter proposed {d} token{'s' if d > 1 else ''} as {shape}"
                     + (f" (from {', '.join(srcs)})" if srcs else "") + ". The target model checked all of them "
                     "in **one** forward pass.")
        if a:
            parts.append(f"It agreed with the first {a}: {q(ev.tokens[:a])}.")
        elif leaves == 1:
            parts.append("It disagreed with the very first drafted token.")
        else:
            parts.append("None of the branches started with the token it wanted.")
        if own is not None:
            stop_at = ev.accepted_nodes[-1] if ev.accepted_nodes else -1
            rejected = [ev.tree.tokens[i] for i, p in enumerate(ev.tree.parents)
                        if p == stop_at and not ev.tree.is_probe(i)]
            if rejected:
                parts.append(f"At the {'next' if a else 'first'} position the target wanted {q([own])} where the "
                             "draft said "
                             + " or ".join(q([t]) for t in rejected[:3])
                             + ", so the rest of the draft was dropped and the target's own token was kept.")
            else:
                parts.append(f"The draft ended there, and the same forward pass also gave the next token, {q([own])}, "
                             "for free.")
    if d and n > 1:
        parts.append(f"This step added **{n} tokens for one forward pass**; plain decoding needs {n}.")
    elif d:
        parts.append("This step added one token, as a plain step would: the draft cost a little time and saved "
                     "nothing.")
    parts.append(timing)
    if ev.finish_reason:
        why = {"eos": "the model ended its answer", "length": "the max-new-tokens limit was reached",
               "stop": "a stop string appeared"}.get(ev.finish_reason, ev.finish_reason)
        parts.append(f"Generation ends here: {why}.")
    return " ".join(parts)


def step_text_html(rec: RaceRecord, k: int, lane: str) -> str:
    """The lane's text up to step k, step k's tokens outlined."""
    styles, out = _source_colours(rec, lane), []
    for p in groups_of([p for p in rec.pieces[lane] if p.step <= k]):
        if p.text:
            cls = (f"sd-acc sd-s{p.step % 2}" if p.from_draft else "sd-own") + (" sd-now" if p.step == k else "")
            attrs = _source_attrs(styles, p.source if p.from_draft else "own")
            out.append(f'<span class="{cls}"{attrs}>{_esc(p.text)}</span>')
    return f'<div class="sd-scroll sd-scroll-small"><div class="sd-text">{"".join(out)}</div></div>'


def show_step(rec: RaceRecord | None, k: float | None, lane: str | None = None) -> tuple[str, str, str]:
    """Step k (from 1) of a method lane: its tree, the account of it, and the text so far."""
    key = rec.chosen_lane(lane) if rec is not None else None
    if key is None or not rec.runs[key].events:
        empty = ('<div class="sd-muted">Run a race first: every verification step of the speculative run shows '
                 'here.</div>')
        return empty, "", ""
    n = len(rec.runs[key].events)
    k = min(max(int(k or 1), 1), n) - 1
    return tree_html(rec, k, key), explain_step(rec, k, key), step_text_html(rec, k, key)


def bench_bars_html(speedups: dict[str, float], baseline: str = "Autoregressive") -> str:
    """Speedup per method as horizontal bars, with the 1.0× line (the `baseline`) marked."""
    top = max([1.0, *speedups.values()]) * 1.1
    rows = "".join(
        f'<div class="sd-bb-row"><span class="sd-bb-name">{_esc(name)}</span><span class="sd-bb-track">'
        f'<span class="sd-bb-bar{" sd-bb-base" if v == 1.0 and name == baseline else ""}" '
        f'style="width:{100 * v / top:.1f}%"></span><span class="sd-bb-one" style="left:{100 / top:.1f}%"></span>'
        f'</span><b>{v:.2f}×</b></div>' for name, v in speedups.items())
    return f'<div class="sd-bb"><div class="sd-bb-title">Speedup vs autoregressive</div>{rows}</div>'
