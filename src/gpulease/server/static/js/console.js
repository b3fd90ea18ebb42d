// What every console page's scripts share (window.Gpulease): a same-origin fetch that sends a
// logged-out viewer to the login page, a poll loop that pauses in background tabs, and the
// "Live" badge of a page that refreshes itself.
(function () {
  "use strict";

  // fetch(url) with the session cookie and no cache; a 401 goes to the login page (coming
  // back here after) and throws. Other statuses are the caller's to read.
  async function request(url, accept) {
    const response = await fetch(url, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: accept || "application/json" },
    });
    if (response.status === 401) {
      window.location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
      throw new Error("log in again");
    }
    return response;
  }

  // The JSON body of GET url; a refusal throws with the server's message.
  async function getJSON(url) {
    const response = await request(url, "application/json");
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.detail || "HTTP " + response.status);
    return data;
  }

  // Calls refresh() every `every` ms while the tab is visible, and at once when it comes
  // back; refresh() is never run twice at the same time. Returns stop().
  function poll(refresh, every) {
    let timer = null;
    let busy = false;
    let stopped = false;
    async function once() {
      if (busy || stopped) return;
      busy = true;
      try {
        await refresh();
      } finally {
        busy = false;
      }
    }
    function schedule() {
      clearTimeout(timer);
      if (document.hidden || stopped) return; // a background tab does not poll
      timer = setTimeout(async () => {
        await once();
        schedule();
      }, every);
    }
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) once();
      schedule();
    });
    schedule();
    return {
      now: once,
      stop() {
        stopped = true;
        clearTimeout(timer);
      },
    };
  }

  // A page's live badge: "on" (Live), "off" (Reconnecting…) or "done" (what it watches has
  // finished; the badge keeps its own words and no longer changes).
  function badge(indicator, state) {
    if (!indicator || indicator.dataset.state === state || indicator.dataset.state === "done") return;
    indicator.dataset.state = state;
    indicator.querySelector(".live-text").textContent = state === "on" ? "Live" : "Reconnecting…";
  }

  window.Gpulease = { request: request, getJSON: getJSON, poll: poll, badge: badge };
})();
