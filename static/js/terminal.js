// The web terminal client (docs/terminal-protocol.md). Our own attach code, not AttachAddon:
// binary frames for PTY bytes both ways, JSON text frames for control, a ticket fetched
// before every connection, reconnect with exponential backoff, client-driven flow control.
(function () {
  "use strict";

  const el = document.getElementById("terminal");
  if (!el || !window.Terminal || !window.FitAddon) return;

  const stateEl = document.getElementById("terminal-state");
  const reconnectButton = document.getElementById("terminal-reconnect");
  const createUrl = el.dataset.createUrl;
  const csrfToken = el.dataset.csrfToken;

  const MAX_FRAME = 64 * 1024; // split pastes: Daphne refuses messages over 1 MiB
  const ACK_BYTES = 100000; // bytes between write callbacks (xterm.js flow-control guide)
  const HIGH = 5; // pending callbacks above which we ask the server to pause
  const LOW = 2; // ... and below which we ask it to resume
  const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];
  const PING_MS = 30000;
  // 4012: the console process is stopping; a kept shell is reattached through another one.
  const RETRY_CODES = new Set([1001, 1005, 1006, 1011, 1012, 1013, 1014, 4012]);
  const CLOSE_PAGE_LEFT = 4100; // not 1000: the server keeps the shell for its grace window
  const MIN_HEIGHT = 160;
  // The terminal id outlives a reload (not the tab): a reload within the server's grace
  // window reattaches the same shell.
  const STORE_KEY = "console.terminal:" + createUrl;

  function rememberedId() {
    try {
      return window.sessionStorage.getItem(STORE_KEY);
    } catch (err) {
      return null;
    }
  }

  function remember(id) {
    try {
      if (id) window.sessionStorage.setItem(STORE_KEY, id);
      else window.sessionStorage.removeItem(STORE_KEY);
    } catch (err) {
      // storage refused: a reload opens a new shell
    }
  }

  document.getElementById("terminal-card").classList.add("terminal-live");
  for (const button of document.querySelectorAll("#terminal-card [data-needs-js]")) button.hidden = false;
  el.style.background = "#000";
  const noticeEl = document.getElementById("terminal-notice");

  // Fill the window below the terminal's top, so the prompt line stays visible down to
  // 800x600; when little room is left under the page head, scroll the card to the top.
  function sizeToWindow(first) {
    const top = el.getBoundingClientRect().top + window.scrollY;
    let height = window.innerHeight - top - 12;
    let scroll = false;
    if (height < MIN_HEIGHT * 1.5) {
      const card = document.getElementById("terminal-card");
      height = window.innerHeight - (el.getBoundingClientRect().top - card.getBoundingClientRect().top) - 12;
      scroll = first;
    }
    el.style.height = Math.max(Math.floor(height), MIN_HEIGHT) + "px";
    if (scroll) document.getElementById("terminal-card").scrollIntoView({ block: "start" });
  }
  sizeToWindow(true);

  const term = new window.Terminal({
    cursorBlink: true,
    convertEol: false,
    scrollback: 5000,
    fontFamily: "ui-monospace, monospace",
    fontSize: 14,
  });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(el);
  fit.fit();

  const encoder = new TextEncoder();
  let socket = null;
  let terminalId = rememberedId();
  let attempt = 0;
  let connectedOnce = false;
  let lastReason = "";
  let state = "connecting";
  let pingTimer = null;
  let pending = 0; // write callbacks not yet run
  let sinceAck = 0;
  let paused = false;
  let stopped = false;

  function showNotice(text) {
    noticeEl.textContent = text;
    noticeEl.hidden = !text;
  }

  function setState(next, detail) {
    state = next;
    stateEl.textContent = detail ? next + ": " + detail : next;
    stateEl.dataset.state = next;
    // console.css makes [hidden] beat the stylesheet's display for buttons.
    reconnectButton.hidden = next !== "closed";
  }

  function sendControl(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  function sendBytes(bytes) {
    if (!socket || socket.readyState !== WebSocket.OPEN) return;
    for (let i = 0; i < bytes.length; i += MAX_FRAME) socket.send(bytes.subarray(i, i + MAX_FRAME));
  }

  function sendSize() {
    sendControl({ type: "resize", cols: term.cols, rows: term.rows });
  }

  function writeOutput(bytes) {
    sinceAck += bytes.length;
    if (sinceAck < ACK_BYTES) {
      term.write(bytes);
      return;
    }
    sinceAck = 0;
    pending += 1;
    if (pending > HIGH && !paused) {
      paused = true;
      sendControl({ type: "pause" });
    }
    term.write(bytes, function () {
      pending = Math.max(pending - 1, 0);
      if (pending < LOW && paused) {
        paused = false;
        sendControl({ type: "resume" });
      }
    });
  }

  async function fetchTicket() {
    let response = await askTicket(terminalId);
    if (terminalId && !connectedOnce && (response.status === 404 || response.status === 410)) {
      // The remembered terminal (before a reload) is over: open a new one.
      terminalId = null;
      remember(null);
      response = await askTicket(null);
    }
    return readTicket(response);
  }

  function askTicket(id) {
    const body = new URLSearchParams();
    if (id) body.set("terminal_id", id);
    return fetch(createUrl, {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken },
      body: body,
      credentials: "same-origin",
    });
  }

  async function readTicket(response) {
    let data = {};
    try {
      data = await response.json();
    } catch (err) {
      data = {};
    }
    if (!response.ok) {
      const error = new Error(data.error || "HTTP " + response.status);
      error.final = response.status >= 400 && response.status < 500;
      throw error;
    }
    return data;
  }

  async function connect() {
    if (stopped) return;
    setState(attempt === 0 ? "connecting" : "reconnecting", attempt ? "attempt " + attempt : "");
    let grant;
    try {
      grant = await fetchTicket();
    } catch (err) {
      if (err.final) {
        setState("closed", err.message);
        return;
      }
      scheduleReconnect();
      return;
    }
    terminalId = grant.terminal_id;
    remember(terminalId);
    const ws = new WebSocket(grant.ws_url + "?ticket=" + encodeURIComponent(grant.ticket));
    ws.binaryType = "arraybuffer";
    socket = ws;
    ws.onopen = function () {
      sendSize(); // queued by the server until the shell runs; re-sent after every reconnect
      clearInterval(pingTimer);
      pingTimer = setInterval(function () {
        sendControl({ type: "ping" });
      }, PING_MS);
    };
    ws.onmessage = function (event) {
      if (typeof event.data !== "string") {
        writeOutput(new Uint8Array(event.data));
        return;
      }
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (message.type === "status") {
        if (message.state === "ready") {
          if (connectedOnce) term.reset(); // the replay that follows redraws the screen
          connectedOnce = true;
          attempt = 0;
          paused = false;
          pending = 0;
          setState("connected", message.replaced ? "new shell" : message.reattached ? "reattached" : "");
          showNotice(message.replaced ? message.message : "");
          if (message.replaced) term.write("\x1b[33m[" + message.message + "]\x1b[0m\r\n");
          term.focus();
        } else if (message.state === "starting") {
          setState("connecting", "starting the shell");
        } else if (message.state === "closed") {
          lastReason = message.reason || "";
        }
      } else if (message.type === "error") {
        lastReason = message.message || "error";
        term.write("\r\n\x1b[31m" + lastReason + "\x1b[0m\r\n");
      }
    };
    ws.onclose = function (event) {
      clearInterval(pingTimer);
      if (socket !== ws) return;
      socket = null;
      if (stopped) return;
      if (RETRY_CODES.has(event.code)) {
        scheduleReconnect();
        return;
      }
      setState("closed", lastReason || event.reason || "code " + event.code);
      terminalId = null; // the shell is over; "Reconnect" opens a new one
      remember(null);
    };
  }

  function scheduleReconnect() {
    if (attempt >= BACKOFF_MS.length) {
      setState("closed", "could not reconnect");
      terminalId = null;
      remember(null);
      return;
    }
    const delay = BACKOFF_MS[attempt];
    attempt += 1;
    setState("reconnecting", "attempt " + attempt + " in " + delay / 1000 + " s");
    setTimeout(connect, delay);
  }

  term.onData(function (data) {
    sendBytes(encoder.encode(data));
  });
  term.onBinary(function (data) {
    const bytes = new Uint8Array(data.length);
    for (let i = 0; i < data.length; i += 1) bytes[i] = data.charCodeAt(i) & 0xff;
    sendBytes(bytes);
  });
  term.onResize(function () {
    sendSize();
  });

  const refit = function () {
    sizeToWindow(false);
    try {
      fit.fit();
    } catch (err) {
      // not laid out yet
    }
  };
  window.addEventListener("resize", refit);
  if (window.ResizeObserver) new ResizeObserver(refit).observe(document.getElementById("terminal-card"));

  document.getElementById("terminal-copy").addEventListener("click", function () {
    const text = term.getSelection();
    if (text && navigator.clipboard) navigator.clipboard.writeText(text);
    term.focus();
  });
  document.getElementById("terminal-paste").addEventListener("click", async function () {
    if (navigator.clipboard && navigator.clipboard.readText) {
      try {
        term.paste(await navigator.clipboard.readText());
      } catch (err) {
        // clipboard permission refused: Ctrl+Shift+V / the browser's paste still work
      }
    }
    term.focus();
  });
  reconnectButton.addEventListener("click", function () {
    attempt = 0;
    lastReason = "";
    term.reset();
    connectedOnce = false;
    terminalId = null;
    remember(null);
    showNotice("");
    connect();
  });
  window.addEventListener("pagehide", function () {
    stopped = true;
    // A reload cannot be told from leaving: keep the shell for the grace window either way.
    if (socket) socket.close(CLOSE_PAGE_LEFT, "page left");
  });

  // For tests and the curious: the xterm object and the connection state.
  window.consoleTerminal = {
    term: term,
    fit: fit,
    state: function () {
      return state;
    },
    terminalId: function () {
      return terminalId;
    },
  };

  connect();
})();
