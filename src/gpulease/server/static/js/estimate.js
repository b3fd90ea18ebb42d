// The create form's estimate panel: asks /api/v1/estimate for the training run described in
// the panel and shows the row of the GPU model chosen in the form. Plain JS, same origin.
(function () {
  "use strict";
  const panel = document.getElementById("estimate");
  if (!panel) return;
  const endpoint = panel.dataset.endpoint;
  const $ = (id) => document.getElementById(id);
  const inputs = {
    gpu: $("gpu-model"),
    count: $("gpu-count"),
    model: $("est-model"),
    images: $("est-images"),
    epochs: $("est-epochs"),
    size: $("est-size"),
  };
  const result = $("estimate-result");
  const basis = $("estimate-basis");
  const error = $("estimate-error");
  let timer = null;
  let asked = 0;

  function wallTime(seconds) {
    if (seconds < 60) return seconds + " s";
    const minutes = Math.round(seconds / 60);
    if (minutes < 60) return minutes + " min";
    const hours = Math.floor(minutes / 60);
    if (hours < 48) return hours + " h" + (minutes % 60 ? " " + (minutes % 60) + " min" : "");
    const days = Math.floor(hours / 24);
    return days + " d" + (hours % 24 ? " " + (hours % 24) + " h" : "");
  }

  function ncuText(text) {
    const value = Number(text);
    if (value > 0 && value < 0.0001) return "<0.0001";
    return value.toFixed(4);
  }

  function showError(message) {
    result.hidden = true;
    basis.textContent = "";
    error.textContent = message;
    error.hidden = false;
  }

  function show(data) {
    const chosen = inputs.gpu.value;
    const row = data.rows.find((r) => r.gpu_model === chosen);
    if (!row) {
      showError("no estimate for " + chosen + " (no throughput figure for it)");
      return;
    }
    error.hidden = true;
    $("est-gpu-hours").textContent = row.gpu_hours.toFixed(3);
    $("est-wall").textContent = wallTime(row.wall_seconds);
    $("est-cost").textContent = row.cost;
    $("est-ncu").textContent = ncuText(row.ncu);
    const devices = row.is_gpu ? row.devices + " × " + row.gpu_model : "CPU only";
    basis.textContent =
      devices + " at " + Math.round(row.images_per_second).toLocaleString() +
      " img/s each (" + row.basis + ": " + row.source + ")";
    result.hidden = false;
  }

  async function refresh() {
    const isGpu = inputs.gpu.selectedOptions[0]?.dataset.gpu === "yes";
    const params = new URLSearchParams({
      model: inputs.model.value,
      images: inputs.images.value,
      epochs: inputs.epochs.value,
      image_size: inputs.size.value,
      gpus: isGpu ? inputs.count.value || "1" : "1",
    });
    for (const hidden of document.querySelectorAll("[data-mirror]")) {
      hidden.value = $(hidden.dataset.mirror).value;
    }
    const mine = ++asked;
    try {
      const response = await fetch(endpoint + "?" + params, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (mine !== asked) return; // a newer question is on its way
      const data = await response.json().catch(() => ({}));
      if (!response.ok) {
        showError(data.detail || "the estimate failed (HTTP " + response.status + ")");
        return;
      }
      show(data);
    } catch (_) {
      if (mine === asked) showError("could not reach the server for an estimate");
    }
  }

  function later() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 250);
  }

  for (const input of Object.values(inputs)) {
    if (!input) continue;
    input.addEventListener("input", later);
    input.addEventListener("change", later);
  }
  refresh();
})();
