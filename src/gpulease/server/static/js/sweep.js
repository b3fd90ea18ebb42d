// A sweep's page: every trial's curve of the chosen metric overlaid on one chart (GET
// /api/v1/sweeps/{id}/curves?key=..), as the compare page overlays runs; while the sweep
// runs, live.js refreshes the trials table and the chart reads its curves again.
"use strict";
window.GpuleaseCharts.page("sweep-curves", (card, C) => {
  const key = card.dataset.key;
  const labels = JSON.parse(card.dataset.labels || "{}");
  const grid = document.getElementById("sweep-charts");

  // Each trial's row takes the colour of its curve.
  function paint() {
    document.querySelectorAll("#sweep-trials tr[data-run]").forEach((row) => {
      const i = Number(row.dataset.order);
      row.style.setProperty("--run-color", C.color(i));
    });
  }
  paint();
  if (!key) return;
  const drawn = C.overlay(grid, key, card.dataset.url, (r) => labels[r.run.id] || "#" + r.run.id, "sweep");
  document.addEventListener("live:updated", async () => {
    paint();
    const chart = await drawn;
    if (chart) chart.reload();
  });
});
