// The live log tail: follows one run's output over the server-sent event stream
// /api/v1/runs/{id}/stream?metrics=false (events: log, status, end). It follows the newest run
// unless the user picked one (data-follow="pinned"); the session cookie authenticates it.
(function () {
  "use strict";
  const card = document.getElementById("log");
  if (!card) return;
  const output = document.getElementById("log-output");
  const label = document.getElementById("log-label");
  const statusBox = document.getElementById("log-status");
  const commandBox = document.getElementById("log-command");
  const note = document.getElementById("log-note");
  const mode = document.getElementById("log-mode");
  const followButton = document.getElementById("log-follow");
  const MAX_CHUNKS = 5000;
  const RETRY_MS = 2000;

  let source = null;
  let runId = null;
  let lastSeq = -1;
  let ended = false;
  let retry = null;

  function pill(status) {
    const span = document.createElement("span");
    span.className = "pill pill-" + String(status).replace(/[^a-z_]/g, "");
    span.textContent = status;
    return span;
  }

  function close() {
    clearTimeout(retry);
    if (source) source.close();
    source = null;
  }

  function append(chunk) {
    const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 8;
    const span = document.createElement("span");
    if (chunk.stream === "stderr") span.className = "stderr";
    span.textContent = chunk.data;
    output.append(span);
    while (output.childElementCount > MAX_CHUNKS) output.firstElementChild.remove();
    if (atBottom) output.scrollTop = output.scrollHeight;
  }

  function connect() {
    const id = runId;
    const es = new EventSource(`/api/v1/runs/${id}/stream?metrics=false&since=${lastSeq}:0`);
    source = es;
    es.addEventListener("log", (event) => {
      const chunk = JSON.parse(event.data);
      if (id !== runId || chunk.seq <= lastSeq) return; // a reconnect may repeat chunks
      lastSeq = chunk.seq;
      append(chunk);
    });
    es.addEventListener("status", (event) => {
      if (id === runId) statusBox.replaceChildren(pill(JSON.parse(event.data).status));
    });
    es.addEventListener("end", (event) => {
      const end = JSON.parse(event.data);
      es.close();
      if (id !== runId) return;
      ended = true;
      source = null;
      statusBox.replaceChildren(pill(end.status));
      note.textContent =
        end.exit_code === null ? "The run ended without an exit code." : `Exited with code ${end.exit_code}.`;
    });
    es.onerror = () => {
      es.close();
      if (ended || es !== source) return;
      source = null;
      probe(id);
    };
  }

  // The stream broke or was refused: find out why before trying again.
  async function probe(id) {
    let response = null;
    try {
      response = await fetch(`/api/v1/runs/${id}`, { credentials: "same-origin", cache: "no-store" });
    } catch (_) {
      response = null;
    }
    if (id !== runId) return;
    if (response && response.status === 401) {
      window.location.assign("/login");
      return;
    }
    if (response && response.status === 404) {
      note.textContent = "This run does not exist or is not yours.";
      return;
    }
    note.textContent = "Connection lost; reconnecting…";
    retry = setTimeout(() => {
      if (id !== runId) return;
      note.textContent = "";
      connect();
    }, RETRY_MS);
  }

  function markSelected() {
    for (const row of document.querySelectorAll("#runs tr[data-run-id]")) {
      row.classList.toggle("selected", Number(row.dataset.runId) === runId);
    }
  }

  function show(id, after, row) {
    close();
    runId = id;
    lastSeq = after;
    ended = false;
    output.replaceChildren();
    note.textContent = after >= 0 ? "Earlier output is left out; `gpulease logs` shows all of it." : "";
    if (row) {
      label.textContent = row.dataset.label;
      statusBox.replaceChildren(pill(row.dataset.status));
      const code = document.createElement("code");
      code.textContent = row.dataset.command;
      commandBox.replaceChildren(code);
    }
    card.dataset.runId = String(id);
    markSelected();
    connect();
  }

  function newestRow() {
    return document.querySelector("#runs tr[data-run-id]");
  }

  function showRow(row) {
    show(Number(row.dataset.runId), Number(row.dataset.tailFrom), row);
  }

  function setPinned(pinned) {
    card.dataset.follow = pinned ? "pinned" : "latest";
    mode.textContent = pinned ? "pinned" : "following the newest run";
    followButton.hidden = !pinned;
  }

  document.addEventListener("live:updated", () => {
    const newest = newestRow();
    if (card.dataset.follow === "latest" && newest && Number(newest.dataset.runId) !== runId) {
      showRow(newest);
    }
    markSelected();
  });

  document.addEventListener("click", (event) => {
    const link = event.target.closest("[data-run-link]");
    if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
    const row = link.closest("tr[data-run-id]");
    if (!row) return;
    event.preventDefault();
    setPinned(true);
    history.replaceState(null, "", link.getAttribute("href"));
    if (Number(row.dataset.runId) !== runId) showRow(row);
  });

  followButton.addEventListener("click", () => {
    setPinned(false);
    history.replaceState(null, "", "/");
    const newest = newestRow();
    if (newest && Number(newest.dataset.runId) !== runId) showRow(newest);
  });

  if (card.dataset.runId) show(Number(card.dataset.runId), Number(card.dataset.after), null);
})();
