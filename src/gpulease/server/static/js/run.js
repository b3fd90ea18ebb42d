// The run page's curves: one chart per metric key, first from /api/v1/runs/{id}/metrics,
// then grown live from the `metric` events of /api/v1/runs/{id}/stream (logs=false: the log
// card has its own stream, logtail.js).
"use strict";
window.GpuleaseCharts.page("metrics", (card, C) => {
  const runId = card.dataset.runId;
  const grid = document.getElementById("metric-charts");
  const note = document.getElementById("metrics-note");
  const empty = document.getElementById("metrics-empty");
  const count = document.getElementById("metric-count");
  const charts = new Map(); // key -> {chart, curve, ranks}
  let source = null;
  // A step reported by several sources is one point: the SDK's value, then TensorBoard's,
  // then stdout's (as the server's series). A loaded series does not say which source each
  // step came from: it ranks as TensorBoard, so a later SDK point wins and a stdout one not.
  const RANKS = { sdk: 0, tensorboard: 1, stdout: 2 };
  const LOADED = 1;

  function chartFor(key) {
    let entry = charts.get(key);
    if (entry) return entry;
    const el = C.box(grid, key);
    el.dataset.metricKey = key;
    const chart = new C.Chart(el, {
      title: key,
      name: "run:" + key,
      series: [{ label: key, color: C.color(charts.size) }],
    });
    entry = { chart: chart, curve: new C.Curve(), ranks: new Map() };
    charts.set(key, entry);
    empty.hidden = true;
    count.textContent = String(charts.size);
    return entry;
  }

  function draw(entry) {
    entry.chart.set([entry.curve.steps.slice(), entry.curve.values.slice()]);
  }

  function onMetric(event) {
    const touched = new Set();
    for (const p of JSON.parse(event.data).points || []) {
      const entry = chartFor(p.key);
      const rank = p.source in RANKS ? RANKS[p.source] : 3;
      const held = entry.ranks.get(p.step);
      if (held !== undefined && held <= rank) continue;
      entry.ranks.set(p.step, rank);
      entry.curve.add(p.step, p.value);
      touched.add(entry);
    }
    touched.forEach(draw);
  }

  function follow(lastPointId) {
    const es = new EventSource(`/api/v1/runs/${runId}/stream?logs=false&since=-1:${lastPointId}`);
    source = es;
    es.addEventListener("metric", onMetric);
    es.addEventListener("end", () => {
      es.close();
      note.textContent = "";
    });
    es.onopen = () => {
      note.textContent = "";
    };
    es.onerror = () => {
      // EventSource reconnects by itself with Last-Event-ID; a refusal closes it for good.
      note.textContent = es.readyState === EventSource.CLOSED ? "Live updates stopped; reload the page." : "Reconnecting…";
    };
  }

  async function start() {
    const data = await C.load(`/api/v1/runs/${runId}/metrics`, note, "Could not load the metrics");
    if (!data) return;
    const series = (data.series || []).slice().sort((a, b) => C.keyOrder(a.key, b.key));
    for (const s of series) {
      const entry = chartFor(s.key);
      entry.curve = new C.Curve(s.steps, s.values);
      for (const step of s.steps) entry.ranks.set(step, LOADED);
      draw(entry);
    }
    if (data.series && data.series.some((s) => s.downsampled)) {
      note.textContent = "Long curves are thinned for drawing; the CSV has every point.";
    }
    if (data.run && (data.run.status === "succeeded" || data.run.status === "failed")) return;
    follow(data.last_point_id || 0);
  }

  window.addEventListener("pagehide", () => source && source.close());
  start();
});
