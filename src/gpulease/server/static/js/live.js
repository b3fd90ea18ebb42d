// Live regions. The element with data-live-src is refreshed every data-live-every ms: the
// server answers with HTML fragments, and each fragment that has an id and data-live replaces
// the element with that id. After each refresh, "live:updated" fires on the document.
(function () {
  "use strict";
  const root = document.querySelector("[data-live-src]");
  if (!root) return;
  const src = root.dataset.liveSrc;
  const every = Number(root.dataset.liveEvery) || 2000;
  const indicator = document.getElementById("live-state");
  let timer = null;
  let busy = false;

  function setState(state) {
    if (!indicator || indicator.dataset.state === state) return;
    indicator.dataset.state = state;
    indicator.querySelector(".live-text").textContent = state === "on" ? "Live" : "Reconnecting…";
  }

  function swap(html) {
    const template = document.createElement("template");
    template.innerHTML = html;
    for (const fresh of template.content.querySelectorAll("[data-live][id]")) {
      const current = document.getElementById(fresh.id);
      if (current && current.outerHTML !== fresh.outerHTML) current.replaceWith(fresh);
    }
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const response = await fetch(src, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/html" },
      });
      if (response.status === 401) {
        window.location.assign("/login");
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      swap(await response.text());
      setState("on");
      document.dispatchEvent(new CustomEvent("live:updated"));
    } catch (_) {
      setState("off");
    } finally {
      busy = false;
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (document.hidden) return; // a background tab does not poll
    timer = setTimeout(async () => {
      await refresh();
      schedule();
    }, every);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
    schedule();
  });
  schedule();
})();
