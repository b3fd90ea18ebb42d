// The instance page's GPU charts: utilisation, memory, power and temperature of each real GPU,
// first from /api/v1/instances/{id}/gpus, then grown live from its `sample` events
// (/gpus/stream). Simulated GPUs have no readings and no charts. The GPU card is one of the
// page's live parts: when the instance comes to hold other GPUs (it was queued or starting
// when the page loaded, it stopped, it was resized), live.js swaps in a new card and its
// charts are drawn again here, without loading the page again.
"use strict";
(function () {
  const METRICS = [
    { key: "util_pct", title: "Utilisation %", range: [0, 100] },
    { key: "memory_used_mb", title: "Memory used (MiB)" },
    { key: "power_w", title: "Power (W)" },
    { key: "temperature_c", title: "Temperature (°C)" },
  ];
  const MAX_POINTS = 2000;

  // Draws the charts of `card` (the #gpus section) and follows its readings; returns the
  // function that stops following them and removes the charts.
  function charts(card, C) {
    const id = card.dataset.instance;
    const note = card.querySelector("#gpu-note");
    const gpus = new Map(); // uuid -> {times, values: {key: []}, charts: {key: Chart}, waiting}
    let closed = false;
    let es = null;

    function setup(cardEl) {
      const uuid = cardEl.dataset.gpuUuid;
      const entry = { times: [], values: {}, charts: {}, waiting: cardEl.querySelector("[data-gpu-waiting]") };
      for (const m of METRICS) {
        entry.values[m.key] = [];
        const el = cardEl.querySelector(`[data-gpu-metric="${m.key}"]`);
        if (!el) continue;
        entry.charts[m.key] = new C.Chart(el, {
          title: m.title,
          time: true,
          name: `gpu:${uuid}:${m.key}`,
          height: 160,
          legend: false,
          yRange: m.range,
          series: [{ label: m.title }],
        });
      }
      gpus.set(uuid, entry);
    }

    function draw(entry) {
      if (entry.times.length && entry.waiting) entry.waiting.hidden = true;
      for (const m of METRICS) {
        const chart = entry.charts[m.key];
        if (chart) chart.set([entry.times.slice(), entry.values[m.key].slice()]);
      }
    }

    function add(entry, sample) {
      entry.times.push(sample.time);
      for (const m of METRICS) entry.values[m.key].push(sample[m.key]);
      if (entry.times.length > MAX_POINTS) {
        entry.times.shift();
        for (const m of METRICS) entry.values[m.key].shift();
      }
    }

    async function start() {
      for (const el of card.querySelectorAll('.gpu-card[data-simulated="no"]')) setup(el);
      if (!gpus.size) return;
      const data = await C.load(`/api/v1/instances/${id}/gpus`, note, "Could not load GPU readings");
      if (!data || closed) return;
      for (const g of data.gpus || []) {
        const entry = gpus.get(g.uuid);
        if (!entry || !g.series) continue;
        entry.times = g.series.times.slice();
        for (const m of METRICS) entry.values[m.key] = (g.series[m.key] || []).slice();
        draw(entry);
      }
      es = new EventSource(`/api/v1/instances/${id}/gpus/stream?since=${data.last_sample_id || 0}`);
      es.addEventListener("sample", (event) => {
        const touched = new Set();
        for (const s of JSON.parse(event.data).samples || []) {
          const entry = gpus.get(s.uuid);
          if (!entry) continue;
          add(entry, s);
          touched.add(entry);
        }
        touched.forEach(draw);
      });
      es.onerror = () => {
        note.textContent = es.readyState === EventSource.CLOSED ? "Live readings stopped; reload the page." : "Reconnecting…";
      };
      es.onopen = () => {
        note.textContent = "";
      };
    }

    start();
    return () => {
      closed = true;
      if (es) es.close();
      for (const entry of gpus.values()) for (const chart of Object.values(entry.charts)) chart.destroy();
    };
  }

  let shown = null; // {card, close}: the #gpus section whose charts are drawn
  function follow() {
    window.GpuleaseCharts.page("gpus", (card, C) => {
      if (shown && shown.card === card) return;
      if (shown) shown.close();
      shown = { card: card, close: charts(card, C) };
    });
  }

  if (!window.GpuleaseCharts) return;
  document.addEventListener("live:updated", follow);
  window.addEventListener("pagehide", () => shown && shown.close());
  follow();
})();
