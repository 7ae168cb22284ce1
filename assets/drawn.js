() => {
  // Acknowledges each race update once it is painted and the browser has gone idle.  A race watched from the
  // machine that runs it waits for this before its next step, so the drawing never overlaps a timed step
  // (specdemo/app/drawn.py).  The summary carries the update's token in data-update.
  let last = null;
  const send = (token) => fetch("gradio_api/run/drawn", {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({data: [token]}),
  }).catch(() => {});
  const check = () => {
    const el = document.querySelector("#sd-summary [data-update]");
    const token = el && el.dataset.update;
    if (!token || token === last) return;
    last = token;
    // the next frame paints the update; idle afterwards means the charts' asynchronous rendering is done too, and
    // one more frame lets the compositor finish rastering what was painted
    const painted = () => requestAnimationFrame(() => requestIdleCallback(() => requestAnimationFrame(
      () => requestAnimationFrame(() => requestIdleCallback(() => send(token), {timeout: 1000}))), {timeout: 1000}));
    // an update that redraws the charts is drawn once every shown chart has its marks: the first one loads the
    // charting module, and the page is idle while that loads, so idleness alone would acknowledge it too early
    if (el.dataset.plots) chartsDrawn(painted, performance.now() + 1500); else painted();
  };
  const chartsDrawn = (then, deadline) => {
    const shown = [...document.querySelectorAll(".sd-plot")].filter((p) => p.offsetParent !== null);
    if (shown.every((p) => p.querySelector(".vega-embed .marks")) || performance.now() > deadline) then();
    else setTimeout(() => chartsDrawn(then, deadline), 20);
  };
  new MutationObserver(check).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                      attributeFilter: ["data-update"]});
}
