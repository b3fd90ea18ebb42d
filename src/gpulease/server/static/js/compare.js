// Compare runs: for each metric key, the curves of the chosen runs overlaid on one chart
// (GET /api/v1/runs/compare?ids=..&key=..). The picker is a plain GET form.
"use strict";
window.GpuleaseCharts.page("compare", (card, C) => {
  const ids = card.dataset.ids;
  const keys = card.dataset.keys ? card.dataset.keys.split(",") : [];
  const grid = document.getElementById("compare-charts");

  // The legend's run links take the colours of their curves.
  ids.split(",").forEach((id, i) => {
    const item = document.querySelector(`#compare-legend [data-run="${id}"]`);
    if (item) item.style.setProperty("--run-color", C.color(i));
  });

  async function drawKey(key) {
    const el = C.box(grid, key);
    el.dataset.metricKey = key;
    const data = await C.load(`/api/v1/runs/compare?ids=${encodeURIComponent(ids)}&key=${encodeURIComponent(key)}`, el, key);
    if (!data) return;
    const curves = data.runs.map((r) => {
      const s = (r.series || []).find((x) => x.key === key);
      return s ? { steps: s.steps, values: s.values } : { steps: [], values: [] };
    });
    const chart = new C.Chart(el, {
      title: key,
      name: "compare:" + key,
      series: data.runs.map((r, i) => ({ label: "#" + r.run.id, color: C.color(i) })),
    });
    chart.set(C.align(curves));
  }

  if (ids) keys.sort(C.keyOrder).forEach(drawKey);

  // Keep the picker within the limit the page states.
  const form = document.getElementById("picker-form");
  if (form) {
    form.addEventListener("submit", (event) => {
      const picked = Array.from(form.querySelectorAll("input[name=ids]:checked")).map((i) => i.value);
      event.preventDefault();
      window.location.assign("/runs/compare?ids=" + picked.join(","));
    });
  }
});
