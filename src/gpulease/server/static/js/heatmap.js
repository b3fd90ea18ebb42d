// The admin page's GPU utilisation heat map: one row per GPU, one column per time bucket,
// drawn as SVG from GET /api/v1/admin/gpu-heatmap and redrawn every data-every ms.
// A bucket without a sample is left grey; a simulated GPU has no readings and says so:
// no number is ever invented for it.
(function () {
  "use strict";
  const root = document.getElementById("heatmap");
  if (!root || !window.Gpulease) return;
  const SVG = "http://www.w3.org/2000/svg";
  const src = root.dataset.src;
  const every = Number(root.dataset.every) || 15000;
  const indicator = document.getElementById("heatmap-state");
  const LABEL_W = 230;
  const NOW_W = 56;
  const ROW_H = 22;
  const NODE_H = 24;
  const AXIS_H = 22;
  let data = null;

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // 0 % pale blue to 100 % deep indigo, in steps people can tell apart.
  function colour(util) {
    const t = Math.max(0, Math.min(1, util / 100));
    const from = [224, 236, 255];
    const to = [49, 46, 129];
    const mix = from.map((f, i) => Math.round(f + (to[i] - f) * t));
    return "rgb(" + mix.join(",") + ")";
  }

  function clock(unix) {
    const d = new Date(unix * 1000);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }

  function setState(state, message) {
    window.Gpulease.badge(indicator, state);
    const status = document.getElementById("heatmap-status");
    if (status) status.textContent = message || "";
  }

  function gpuLabel(node, gpu) {
    return node.name + " · GPU " + gpu.index + " · " + (gpu.model || gpu.nvml_name);
  }

  function draw() {
    if (!data) return;
    const gpus = [];
    for (const node of data.nodes) {
      if (node.gpus.length) gpus.push({ node: node });
      for (const gpu of node.gpus) gpus.push({ node: node, gpu: gpu });
    }
    root.replaceChildren();
    if (!gpus.length) {
      const p = document.createElement("p");
      p.className = "sub heatmap-status";
      p.id = "heatmap-status";
      p.textContent = "No GPUs are registered: nothing to draw.";
      root.appendChild(p);
      return;
    }
    const buckets = data.buckets;
    const style = getComputedStyle(root);
    const inner = root.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const width = Math.max(Math.floor(inner), 480);
    const cellW = (width - LABEL_W - NOW_W) / Math.max(buckets.length, 1);
    let height = AXIS_H;
    for (const row of gpus) height += row.gpu ? ROW_H : NODE_H;
    const svg = el("svg", {
      class: "heatmap-svg",
      width: width,
      height: height,
      viewBox: "0 0 " + width + " " + height,
      "data-buckets": buckets.length,
    });
    let y = 0;
    for (const row of gpus) {
      if (!row.gpu) {
        svg.appendChild(el("text", { class: "heat-node", x: 0, y: y + 16 }, row.node.name));
        y += NODE_H;
        continue;
      }
      const gpu = row.gpu;
      const g = el("g", {
        class: "heat-row",
        "data-uuid": gpu.uuid,
        "data-simulated": gpu.simulated ? "true" : "false",
      });
      g.appendChild(el("text", { class: "heat-label", x: 8, y: y + 15 },
        "GPU " + gpu.index + " · " + (gpu.model || gpu.nvml_name)));
      if (gpu.simulated) {
        g.appendChild(el("rect", {
          class: "heat-sim", x: LABEL_W, y: y + 2, width: cellW * buckets.length, height: ROW_H - 4, rx: 3,
        }));
        g.appendChild(el("text", {
          class: "heat-sim-text", x: LABEL_W + 10, y: y + 15,
        }, "simulated, no readings"));
      } else {
        let latest = null;
        gpu.util.forEach((util, i) => {
          const cell = el("rect", {
            class: util === null ? "heat-cell heat-empty" : "heat-cell",
            x: (LABEL_W + i * cellW).toFixed(2),
            y: y + 2,
            width: Math.max(cellW - 1, 0.5).toFixed(2),
            height: ROW_H - 4,
            fill: util === null ? "#eef0f3" : colour(util),
            "data-util": util === null ? "" : util.toFixed(1),
          });
          const when = clock(buckets[i]);
          cell.appendChild(el("title", {}, gpuLabel(row.node, gpu) + ", " + when + ": " +
            (util === null ? "no reading" : util.toFixed(0) + " %")));
          g.appendChild(cell);
          if (util !== null) latest = util;
        });
        g.appendChild(el("text", {
          class: "heat-now", x: width - 4, y: y + 15, "text-anchor": "end",
        }, latest === null ? "—" : latest.toFixed(0) + " %"));
      }
      svg.appendChild(g);
      y += ROW_H;
    }
    const every10 = Math.max(1, Math.round(600 / (data.bucket_s || 60)));
    buckets.forEach((start, i) => {
      if (i % every10 !== 0) return;
      svg.appendChild(el("text", {
        class: "heat-axis", x: (LABEL_W + i * cellW).toFixed(2), y: y + 15,
      }, clock(start)));
    });
    svg.appendChild(el("text", {
      class: "heat-axis", x: width - 4, y: y + 15, "text-anchor": "end",
    }, "now"));
    root.appendChild(svg);
  }

  async function refresh() {
    try {
      const response = await window.Gpulease.request(src, "application/json");
      if (!response.ok) throw new Error("HTTP " + response.status);
      data = await response.json();
      draw();
      setState("on");
      root.dataset.loadedAt = String(Date.now());
      document.dispatchEvent(new CustomEvent("heatmap:updated"));
    } catch (err) {
      setState("off", data ? "" : "Could not load the readings (" + err.message + "); retrying.");
    }
  }

  const loop = window.Gpulease.poll(refresh, every);
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(draw, 150);
  });
  loop.now();
})();
