// Live regions. The element with data-live-src is refreshed every data-live-every ms: the
// server answers with HTML fragments, and each fragment that has an id and data-live replaces
// the element with that id. An element whose insides the page's scripts draw (charts) has a
// data-live-key saying what it shows: it is replaced only when that key changes. After each
// refresh, "live:updated" fires on the document. A page whose subject has finished (a run
// that exited) carries data-live-final on a live element: the badge then says so and the
// polling stops.
(function () {
  "use strict";
  const root = document.querySelector("[data-live-src]");
  if (!root || !window.Gpulease) return;
  const G = window.Gpulease;
  const src = root.dataset.liveSrc;
  const every = Number(root.dataset.liveEvery) || 2000;
  const indicator = document.getElementById("live-state");

  function swap(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    for (const fresh of template.content.querySelectorAll("[data-live][id]")) {
      const current = document.getElementById(fresh.id);
      if (!current) continue;
      const key = fresh.dataset.liveKey;
      const changed = key === undefined ? current.outerHTML !== fresh.outerHTML : current.dataset.liveKey !== key;
      if (changed) current.replaceWith(fresh);
    }
  }

  // True when the page shows a finished subject: the badge says what it came to.
  function finished() {
    const final = document.querySelector("[data-live-final]");
    if (!final) return false;
    if (indicator) {
      indicator.dataset.state = "done";
      indicator.querySelector(".live-text").textContent = final.dataset.liveFinal;
    }
    return true;
  }

  if (finished()) return;
  const loop = G.poll(async () => {
    try {
      const response = await G.request(src, "text/html");
      if (!response.ok) throw new Error("HTTP " + response.status);
      swap(await response.text());
      G.badge(indicator, "on");
      document.dispatchEvent(new CustomEvent("live:updated"));
      if (finished()) loop.stop();
    } catch (_) {
      G.badge(indicator, "off");
    }
  }, every);
})();
