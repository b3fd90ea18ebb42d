// Line charts for the console on the vendored uPlot (window.uPlot): a small wrapper that
// sizes a chart to its box, redraws at most once a frame, and lists every chart in
// window.gpuleaseCharts (name -> uPlot instance) so that tests can count its points.
(function () {
  "use strict";
  const PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#e67700", "#495057"];
  const HEIGHT = 220;
  // Steps are whole numbers: no tick at step 1.5.
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7, 1e8, 1e9];
  const registry = (window.gpuleaseCharts = window.gpuleaseCharts || {});

  function color(i) {
    return PALETTE[i % PALETTE.length];
  }

  // Several curves ({steps, values}) on one x axis: the union of their x values, with null
  // where a curve has no point (uPlot wants aligned arrays).
  function align(curves) {
    const xs = new Set();
    for (const c of curves) for (const x of c.steps) xs.add(x);
    const x = Array.from(xs).sort((a, b) => a - b);
    const at = new Map(x.map((v, i) => [v, i]));
    const ys = curves.map((c) => {
      const y = new Array(x.length).fill(null);
      c.steps.forEach((s, i) => {
        y[at.get(s)] = c.values[i];
      });
      return y;
    });
    return [x, ...ys];
  }

  function compact(value) {
    if (value === null || value === undefined || !isFinite(value)) return "—";
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 0.001 || abs >= 1e6)) return value.toExponential(2);
    return Number(value.toPrecision(4)).toString();
  }

  // A chart in `box`: opts.title, opts.time (x is unix seconds), opts.xLabel, opts.series
  // ([{label, color}]), opts.name (its key in window.gpuleaseCharts), opts.yRange ([min, max]).
  function Chart(box, opts) {
    this.box = box;
    this.pending = null;
    const series = [{ label: opts.xLabel || (opts.time ? "time" : "step") }].concat(
      opts.series.map((s, i) => ({
        label: s.label,
        stroke: s.color || color(i),
        width: 1.5,
        spanGaps: true,
        points: { show: false },
        value: (u, v) => compact(v),
      }))
    );
    const scales = { x: { time: !!opts.time } };
    if (opts.yRange) scales.y = { range: () => opts.yRange };
    const empty = [[]].concat(opts.series.map(() => []));
    this.plot = new window.uPlot(
      {
        title: opts.title,
        width: Math.max(box.clientWidth, 200),
        height: opts.height || HEIGHT,
        scales: scales,
        series: series,
        cursor: { drag: { x: true, y: false } },
        legend: { show: opts.legend !== false },
        axes: [opts.time ? {} : { incrs: STEP_INCRS }, { values: (u, ticks) => ticks.map(compact), size: 56 }],
      },
      empty,
      box
    );
    box.dataset.points = "0";
    this.name = opts.name;
    if (opts.name) registry[opts.name] = this.plot;
    this.observer = null;
    if (window.ResizeObserver) {
      this.observer = new ResizeObserver(() => {
        const width = Math.max(box.clientWidth, 200);
        if (width !== this.plot.width) this.plot.setSize({ width: width, height: this.plot.height });
      });
      this.observer.observe(box);
    }
  }

  // The chart is no longer shown (its box was replaced): stop following the box's size.
  Chart.prototype.destroy = function () {
    if (this.observer) this.observer.disconnect();
    this.pending = null;
    if (this.name && registry[this.name] === this.plot) delete registry[this.name];
    this.plot.destroy();
  };

  // New data ([x, y1, y2, ...]); drawn on the next animation frame, once however often set.
  Chart.prototype.set = function (data) {
    const first = this.pending === null;
    this.pending = data;
    if (!first) return;
    const draw = () => {
      const next = this.pending;
      this.pending = null;
      if (next === null) return; // destroyed meanwhile
      this.plot.setData(next);
      this.box.dataset.points = String(next[0].length);
    };
    if (document.hidden) draw();
    else requestAnimationFrame(draw);
  };

  // A curve that grows: points by step (a later value for a step replaces the earlier one).
  function Curve(steps, values) {
    this.steps = steps ? steps.slice() : [];
    this.values = values ? values.slice() : [];
  }

  Curve.prototype.add = function (step, value) {
    const n = this.steps.length;
    if (n === 0 || step > this.steps[n - 1]) {
      this.steps.push(step);
      this.values.push(value);
      return;
    }
    let lo = 0;
    let hi = n;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.steps[mid] < step) lo = mid + 1;
      else hi = mid;
    }
    if (this.steps[lo] === step) this.values[lo] = value;
    else {
      this.steps.splice(lo, 0, step);
      this.values.splice(lo, 0, value);
    }
  };

  // Runs start(card, GpuleaseCharts) for the page's chart card, when the page has it and
  // the chart library loaded.
  function page(id, start) {
    const card = document.getElementById(id);
    if (card && window.uPlot && window.Gpulease) start(card, window.GpuleaseCharts);
  }

  // The JSON at url; null when it cannot be had, after saying why in `note` (what failed:
  // the reason).
  async function load(url, note, what) {
    try {
      return await window.Gpulease.getJSON(url);
    } catch (err) {
      note.textContent = what + ": " + err.message;
      return null;
    }
  }

  // One chart of one key in a new box of `grid`: the curve of each run of the RunsCompared
  // JSON at url (GET /api/v1/runs/compare, /api/v1/sweeps/{id}/curves), overlaid, each
  // labelled label(run, i) in color(i); `name` prefixes its key in window.gpuleaseCharts.
  // The chart's reload() reads url again and redraws the same runs' curves.
  async function overlay(grid, key, url, label, name) {
    const el = box(grid, key);
    el.dataset.metricKey = key;
    const data = await load(url, el, key);
    if (!data) return null;
    const chart = new Chart(el, {
      title: key,
      name: name + ":" + key,
      series: data.runs.map((r, i) => ({ label: label(r, i), color: color(i) })),
    });
    const draw = (answer) =>
      chart.set(
        align(
          answer.runs.map((r) => {
            const s = (r.series || []).find((x) => x.key === key);
            return s ? { steps: s.steps, values: s.values } : { steps: [], values: [] };
          })
        )
      );
    draw(data);
    chart.reload = async () => {
      const fresh = await load(url, el, key);
      if (fresh && fresh.runs.length === data.runs.length) draw(fresh);
    };
    return chart;
  }

  // A titled box for a chart, appended to `parent`.
  function box(parent, name) {
    const el = document.createElement("div");
    el.className = "chart-box";
    el.dataset.chart = name;
    parent.append(el);
    return el;
  }

  // Loss curves first, then accuracies, then the rest, each group by name.
  function keyOrder(a, b) {
    const rank = (k) => (/loss/i.test(k) ? 0 : /acc/i.test(k) ? 1 : 2);
    return rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0);
  }

  window.GpuleaseCharts = {
    keyOrder: keyOrder, Chart: Chart, Curve: Curve, align: align, color: color, load: load, box: box, page: page, compact: compact,
    overlay: overlay };
})();
