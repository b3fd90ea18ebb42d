// The instance terminal: xterm.js bridged to /instances/{id}/terminal/ws.
// Binary frames carry bytes both ways; text frames are JSON: resize (to the server),
// exit and error (from it). No framework, nothing from outside /static.
(function () {
  "use strict";

  function start(box) {
    var state = box.closest(".terminal-card").querySelector("[data-terminal-state]");
    function say(text, bad) {
      if (!state) return;
      state.textContent = text;
      state.classList.toggle("bad", !!bad);
    }
    if (!window.Terminal || !window.FitAddon) {
      say("the terminal script did not load", true);
      return;
    }
    var term = new window.Terminal({
      cursorBlink: true,
      convertEol: false,
      fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace",
      fontSize: 13,
      scrollback: 5000,
    });
    var fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    try { fit.fit(); } catch (e) { /* not laid out yet */ }
    box.gpuleaseTerminal = term;
    window.gpuleaseTerminal = term;

    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + box.dataset.terminalWs +
      "?cols=" + term.cols + "&rows=" + term.rows;
    var ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    var encoder = new TextEncoder();
    var ended = false;

    // The terminal takes the keyboard when it connects only if nobody is typing elsewhere:
    // a user already in the page's run box would otherwise send their keystrokes to the shell.
    ws.onopen = function () {
      say("connected");
      var active = document.activeElement;
      if (!active || active === document.body) term.focus();
    };
    ws.onmessage = function (event) {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data));
        return;
      }
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "exit") {
        ended = true;
        say("the shell exited with code " + message.code + "; reload to open a new one");
        term.write("\r\n[the shell exited with code " + message.code + "]\r\n");
      } else if (message.type === "error") {
        ended = true;
        say(message.message, true);
        term.write("\r\n" + message.message + "\r\n");
      }
    };
    ws.onclose = function (event) {
      if (!ended) say("disconnected (" + event.code + "); reload to reconnect", true);
    };
    term.onData(function (data) {
      if (ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(data));
    });
    term.onBinary(function (data) {
      if (ws.readyState !== WebSocket.OPEN) return;
      var bytes = new Uint8Array(data.length);
      for (var i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 255;
      ws.send(bytes);
    });
    term.onResize(function (size) {
      if (ws.readyState === WebSocket.OPEN) {
        ws.send(JSON.stringify({ type: "resize", cols: size.cols, rows: size.rows }));
      }
    });
    // Keep the terminal the size of its box: the window, the card or the page's layout.
    function refit() {
      try { fit.fit(); } catch (e) { /* hidden */ }
    }
    if (window.ResizeObserver) new ResizeObserver(refit).observe(box);
    else window.addEventListener("resize", refit);
  }

  function init() {
    var boxes = document.querySelectorAll("[data-terminal-ws]");
    for (var i = 0; i < boxes.length; i++) {
      if (!boxes[i].gpuleaseTerminal) start(boxes[i]);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
