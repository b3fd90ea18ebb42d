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

  function drawKey(key) {
    const url = `/api/v1/runs/compare?ids=${encodeURIComponent(ids)}&key=${encodeURIComponent(key)}`;
    return C.overlay(grid, key, url, (r) => "#" + r.run.id, "compare");
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
