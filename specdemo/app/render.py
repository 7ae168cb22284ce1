"""HTML for the page: the two panes, the summary, the step-by-step tree and explanation, the bench bars."""
from __future__ import annotations

import html

from specdemo.app.race import TextBuilder
from specdemo.app.session import MODES, RaceRecord
from specdemo.drafters import LABELS
from specdemo.target import Target


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _visible(text: str) -> str:
    """A token as a tree label: whitespace made visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


def spans_html(rec: RaceRecord, key: str) -> str:
    """The run's text as escaped spans: accepted drafts shaded by step parity, the target's own tokens plain."""
    run = rec.runs[key]
    out = []
    for p in TextBuilder.groups_of(rec.pieces[key]):
        if not p.text:
            continue
        ev = run.events[p.step]
        text = _esc(p.text)
        if key == "ar":
            out.append(text)
        elif p.from_draft:
            tip = (f"step {p.step + 1} · accepted {ev.accepted} of {ev.tree_size} drafted · "
                   f"source: {p.source or 'draft'}")
            out.append(f'<span class="sd-acc sd-s{p.step % 2}" data-step="{p.step + 1}" title="{_esc(tip)}">'
                       f'{text}</span>')
        else:
            tip = (f"step {p.step + 1} · the target's own token · accepted {ev.accepted} of {ev.tree_size} drafted"
                   if ev.tree_size else f"step {p.step + 1} · the target's own token · nothing was drafted")
            out.append(f'<span class="sd-own" data-step="{p.step + 1}" title="{_esc(tip)}">{text}</span>')
    return "".join(out)


def pane_html(rec: RaceRecord | None, key: str) -> str:
    """One side of the race: title, live stats, a progress bar and the streamed text."""
    title = "Autoregressive" if key == "ar" else (rec.label if rec else "Speculative")
    badge = "baseline · one token per forward" if key == "ar" else "speculative · drafts verified in one forward"
    if rec is None or (rec.status == "error" and not rec.runs[key].events):
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
    legend = ""
    if key == "spec":
        legend = ('<div class="sd-legend"><span class="sd-acc sd-s0">accepted</span><span class="sd-acc sd-s1">draft'
                  '</span> tokens (shade alternates per step) · plain = the target\'s own token · hover for details'
                  '</div>')
    return (f'<div class="sd-pane sd-pane-{key}"><div class="sd-pane-head"><span class="sd-pane-title">{_esc(title)}'
            f'</span><span class="sd-badge">{badge}</span></div><div class="sd-stats">{stats}</div>'
            f'<div class="sd-bar"><div style="width:{pct:.1f}%"></div></div>{legend}'
            f'<div class="sd-scroll"><div class="sd-text">{body}</div></div></div>')


def summary_html(rec: RaceRecord | None, update: str | None = None, drawn: int = 0) -> str:
    """Speedup, τ, forwards saved and the identical-output check; live while racing, final at the end.

    `update` is the token the page acknowledges once it has drawn this update (app/drawn.py); `drawn` counts the
    race's updates acknowledged so far."""
    ack = f' data-update="{update}"' if update else ""
    if rec is None or rec.summary is None:
        return (f'<div class="sd-summary sd-muted"{ack}>The two decoders run interleaved in one process; the one that has '
                'used less compute so far always goes next, so each pane grows at its true speed.</div>')
    s = rec.summary
    final = not rec.active
    note = "final" if rec.status == "done" else ("so far" if rec.active else rec.status)
    speed = "–" if s.speedup is None else f"{s.speedup:.2f}×"
    ident_cls = "sd-ok" if s.identical else "sd-bad"
    if s.identical:
        ident = "✓ identical" if s.complete else "✓ identical so far"
    else:
        ident = f"✗ differ at token {s.first_difference}"
    cards = [
        ("Speedup", speed, f"tokens/s vs autoregressive ({note})", "sd-big" if final else ""),
        ("τ", f"{s.tau:.2f}", "tokens per target forward", ""),
        ("Forwards saved", f"{s.forwards_saved}", f"{s.baseline_forwards} → {s.forwards} target forwards", ""),
        ("Outputs", ident, "token lists compared", ident_cls),
    ]
    inner = "".join(f'<div class="sd-card {cls}"><div class="sd-card-label">{k}</div><div class="sd-card-value">{v}'
                    f'</div><div class="sd-card-note">{n}</div></div>' for k, v, n, cls in cards)
    wall, other = rec.wall_s, rec.other_s
    clock = (f'<div class="sd-clock">wall {wall:.2f} s: decoding {wall - other:.2f} s · page and bookkeeping '
             f'{other:.2f} s ({100 * other / wall:.0f}%), not charged to either run</div>' if wall > 0 else "")
    data = (f'data-status="{rec.status}" data-speedup="{s.speedup or 0:.4f}" '
            f'data-ar-tps="{rec.runs["ar"].tokens_per_s:.4f}" data-wall-s="{wall:.3f}" data-page-s="{other:.3f}" '
            f'data-drawn="{drawn}"{ack}')
    return f'<div class="sd-summary" {data}>{inner}{clock}</div>'


def message_html(text: str | None, kind: str = "error") -> str:
    if not text:
        return ""
    return f'<div class="sd-msg sd-msg-{kind}">{_esc(text)}</div>'


def header_html(target: Target | None, error: str | None = None) -> str:
    chip = (f'<span class="sd-chip">{_esc(target.describe())}</span>' if target
            else f'<span class="sd-chip sd-chip-bad">{_esc(error or "no model loaded")}</span>')
    return (f'<div class="sd-header"><div><h1>specdemo <span>· speculative decoding, made visible</span></h1>'
            f'<p>A small model drafts, the big one checks many tokens in one pass: same output, fewer passes. '
            f'Race it against plain decoding and watch every step.</p></div>{chip}</div>')


def modes_html(avail: dict[str, str | None]) -> str:
    """The modes that cannot run on this model, each with its reason (and the command that fixes it)."""
    off = [m for m in MODES if avail.get(m)]
    rows = [f'<div class="sd-mode-off"><b>{_esc(LABELS.get(m, m))}</b> {_esc(avail[m])}</div>' for m in off]
    # grey out and disable those choices in the radio above (its inputs carry the method as their value)
    style = "".join(f'#sd-mode label:has(input[value="{m}"]) {{ opacity: .45; pointer-events: none; '
                    f'border-style: dashed; }}' for m in off)
    return f'<style>{style}</style><div class="sd-modes">{"".join(rows)}</div>' if rows else ""


def _root_token(rec: RaceRecord, k: int) -> int | None:
    """The newest committed token before spec step k (the tree hangs off it)."""
    for ev in reversed(rec.runs["spec"].events[:k]):
        if ev.tokens:
            return ev.tokens[-1]
    return rec.prompt_tail[-1] if rec.prompt_tail else None


def tree_html(rec: RaceRecord, k: int) -> str:
    """The proposed tree of step k: accepted path green, the drafts the target rejected red, its own token starred.

    Runs of single children are drawn on one line, so a chain reads left to right and only branches indent.
    """
    ev = rec.runs["spec"].events[k]
    tree, tt = ev.tree, rec.token_text
    depths = tree.depths()
    accepted = set(ev.accepted_nodes)
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    stop_at = ev.accepted_nodes[-1] if ev.accepted_nodes else -1  # the node the acceptance walk ended on
    OWN = "own"
    children: dict[int, list] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    if own is not None:  # first among its siblings: the target's choice, then the drafts it rejected
        children.setdefault(stop_at, []).insert(0, OWN)

    def label(tok: int | None) -> str:
        return "" if tok is None else _esc(_visible(tt.get(tok, f"#{tok}")))

    def chip(item) -> str:
        if item == OWN:
            return f'<span class="sd-node sd-n-own" title="the token the target chose here">★ {label(own)}</span>'
        if item == -1:
            return (f'<span class="sd-node sd-n-root" title="the newest committed token: the tree hangs off it">'
                    f'{label(_root_token(rec, k))}</span>')
        cls = ("sd-n-probe" if tree.is_probe(item) else "sd-n-acc" if item in accepted
               else "sd-n-rej" if tree.parents[item] == stop_at and own is not None else "sd-n-other")
        src = tree.sources[item] if tree.sources else "draft"
        tip = f"node {item} · depth {depths[item]} · source: {src}" + (" · probe" if tree.is_probe(item) else "")
        return f'<span class="sd-node {cls}" title="{_esc(tip)}">{label(tree.tokens[item])}</span>'

    def branch(item) -> str:
        line = [chip(item)]
        kids = children.get(item, []) if item != OWN else []
        while len(kids) == 1:
            item = kids[0]
            line.append(chip(item))
            kids = children.get(item, []) if item != OWN else []
        leaves = all(c == OWN or not children.get(c) for c in kids)  # a row of leaves wraps instead of stacking
        sub = (f'<ul{" class=sd-leaves" if leaves else ""}>' + "".join(f"<li>{branch(c)}</li>" for c in kids)
               + "</ul>" if kids else "")
        return '<span class="sd-arrow">→</span>'.join(line) + sub

    legend = ('<div class="sd-tree-legend"><span class="sd-node sd-n-root">root</span>'
              '<span class="sd-node sd-n-acc">accepted</span><span class="sd-node sd-n-rej">rejected here</span>'
              '<span class="sd-node sd-n-other">not reached</span><span class="sd-node sd-n-own">★ target\'s own'
              '</span></div>')
    return f'<div class="sd-tree">{legend}<ul><li>{branch(-1)}</li></ul></div>'


def explain_step(rec: RaceRecord, k: int) -> str:
    """Plain-language account of spec step k (markdown)."""
    ev = rec.runs["spec"].events[k]
    tt = rec.token_text
    q = lambda toks: "“" + "".join(tt.get(t, "") for t in toks).replace("\n", "↵") + "”"  # noqa: E731
    n, d, a = len(ev.tokens), ev.tree_size, ev.accepted
    own = ev.tokens[-1] if ev.tokens and not ev.from_draft[-1] else None
    first = " (this first step also includes reading the prompt)" if k == 0 else ""
    timing = f"Drafting took {1e3 * ev.draft_s:.0f} ms and the check {1e3 * ev.verify_s:.0f} ms{first}."
    parts = [f"**Step {k + 1} of {len(rec.runs['spec'].events)}.**"]
    if d == 0:
        parts.append(f"The {rec.label} drafter had no guess this time, so the target model ran one ordinary forward "
                     f"pass and wrote one token, {q(ev.tokens)} — exactly what plain decoding does.")
    else:
        leaves = sum(1 for i in range(d) if i not in set(ev.tree.parents))
        shape = "a chain" if leaves == 1 else f"a tree with {leaves} branches"
        srcs = sorted({s for s in (ev.tree.sources or []) if s})
        parts.append(f"The {rec.label} drafter proposed {d} token{'s' if d > 1 else ''} as {shape}"
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


def step_text_html(rec: RaceRecord, k: int) -> str:
    """The speculative text up to step k, step k's tokens outlined."""
    out = []
    for p in TextBuilder.groups_of([p for p in rec.pieces["spec"] if p.step <= k]):
        if p.text:
            cls = (f"sd-acc sd-s{p.step % 2}" if p.from_draft else "sd-own") + (" sd-now" if p.step == k else "")
            out.append(f'<span class="{cls}">{_esc(p.text)}</span>')
    return f'<div class="sd-scroll sd-scroll-small"><div class="sd-text">{"".join(out)}</div></div>'


def show_step(rec: RaceRecord | None, k: float | None) -> tuple[str, str, str]:
    if rec is None or not rec.runs["spec"].events:
        empty = ('<div class="sd-muted">Run a race first: every verification step of the speculative run shows '
                 'here.</div>')
        return empty, "", ""
    n = len(rec.runs["spec"].events)
    k = min(max(int(k or 1), 1), n) - 1
    return tree_html(rec, k), explain_step(rec, k), step_text_html(rec, k)


def bench_bars_html(speedups: dict[str, float]) -> str:
    """Speedup per method as horizontal bars, with the 1.0× line (autoregressive) marked."""
    top = max([1.0, *speedups.values()]) * 1.1
    rows = "".join(
        f'<div class="sd-bb-row"><span class="sd-bb-name">{_esc(name)}</span><span class="sd-bb-track">'
        f'<span class="sd-bb-bar{" sd-bb-base" if v == 1.0 and name == LABELS["ar"] else ""}" '
        f'style="width:{100 * v / top:.1f}%"></span><span class="sd-bb-one" style="left:{100 / top:.1f}%"></span>'
        f'</span><b>{v:.2f}×</b></div>' for name, v in speedups.items())
    return f'<div class="sd-bb"><div class="sd-bb-title">Speedup vs autoregressive</div>{rows}</div>'
