// The web terminal client (docs/terminal-protocol.md). Our own attach code, not AttachAddon:
// binary frames for PTY bytes both ways, JSON text frames for control, a ticket fetched
// before every connection, reconnect with exponential backoff, client-driven flow control.
// Several named shells per session, one tab each; xterm.js keeps each one's scrollback
// (searchable with the search addon); font size, full screen and keyboard copy/paste.
(function () {
  "use strict";

  const area = document.getElementById("terminal");
  if (!area || !window.Terminal || !window.FitAddon) return;

  const card = document.getElementById("terminal-card");
  const stateEl = document.getElementById("terminal-state");
  const modeEl = document.getElementById("terminal-mode");
  const tabList = document.getElementById("terminal-tabs");
  const noticeEl = document.getElementById("terminal-notice");
  const reconnectButton = document.getElementById("terminal-reconnect");
  const loginLink = document.getElementById("terminal-login");
  const sessionsLink = document.getElementById("terminal-sessions");
  const searchForm = document.getElementById("terminal-search");
  const searchInput = document.getElementById("terminal-search-input");
  const searchResult = document.getElementById("terminal-search-result");
  const searchToggle = document.getElementById("terminal-search-toggle");
  const fullButton = document.getElementById("terminal-fullscreen");
  const createUrl = area.dataset.createUrl;
  const csrfToken = area.dataset.csrfToken;

  const MAX_FRAME = 64 * 1024; // split pastes: Daphne refuses messages over 1 MiB
  const ACK_BYTES = 100000; // bytes between write callbacks (xterm.js flow-control guide)
  const HIGH = 5; // pending callbacks above which we ask the server to pause
  const LOW = 2; // ... and below which we ask it to resume
  const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];
  const PING_MS = 30000;
  const SCROLLBACK = 10000; // lines each shell keeps in the browser
  // 4012: the console process is stopping; a kept shell is reattached through another one.
  const RETRY_CODES = new Set([1001, 1005, 1006, 1011, 1012, 1013, 1014, 4012]);
  const CLOSE_PAGE_LEFT = 4100; // not 1000: the server keeps the shell for its grace window
  const CLOSE_END_SHELL = 1000; // closing a tab ends its shell
  const MIN_HEIGHT = 160;
  const FONT_MIN = 9;
  const FONT_MAX = 28;
  const MAX_TABS = 8;
  // After a burst of output this large, once output pauses for QUIET_MS, the page asks the
  // server for the kept shell's history: tmux drops what a slow client cannot take and
  // redraws only the screen, so lines scrolled by meanwhile would be missing here.
  const RESYNC_BYTES = 1024;
  const QUIET_MS = 400;
  // What each way a terminal ends means for the person at it: the state's words, and what the
  // page offers next ("new": a new shell here, "login", "sessions", "take": this shell again).
  const ENDINGS = {
    1000: { state: "ended", offer: "new" },
    4000: { state: "closed", words: "idle too long", offer: "new" },
    4001: { state: "logged out", offer: "login" },
    4003: { state: "access lost", offer: "sessions" },
    4004: { state: "session deleted", words: "the session and its sandbox are gone", own: true, offer: "sessions" },
    4009: { state: "taken over", words: "opened in another window", offer: "take" },
    4010: { state: "could not start", offer: "new" },
    401: { state: "logged out", words: "log in again to open a shell", offer: "login" },
    403: { state: "access lost", offer: "sessions" },
    404: { state: "session deleted", words: "this session no longer exists", offer: "sessions" },
    409: { state: "unavailable", offer: "none" },
    410: { state: "ended", offer: "new" },
  };
  // The open tabs (id and name) outlive a reload (not the tab of the browser): a reload within
  // the server's grace window reattaches the same shells.
  const STORE_KEY = "console.terminals:" + createUrl;
  const FONT_KEY = "console.terminal.fontSize";

  const encoder = new TextEncoder();
  const tabs = [];
  let active = null;
  let stopped = false;
  let fontSize = readFontSize();
  let nextNumber = 1;

  function readFontSize() {
    try {
      const stored = Number(window.localStorage.getItem(FONT_KEY));
      if (stored >= FONT_MIN && stored <= FONT_MAX) return stored;
    } catch (err) {
      // storage refused
    }
    return 14;
  }

  function saveTabs() {
    const list = tabs.map(function (tab) {
      return { id: tab.terminalId, name: tab.name };
    });
    try {
      window.sessionStorage.setItem(STORE_KEY, JSON.stringify({ tabs: list, active: tabs.indexOf(active) }));
    } catch (err) {
      // storage refused: a reload opens new shells
    }
  }

  function savedTabs() {
    try {
      const saved = JSON.parse(window.sessionStorage.getItem(STORE_KEY) || "null");
      if (saved && Array.isArray(saved.tabs) && saved.tabs.length) return saved;
    } catch (err) {
      // nothing usable
    }
    return { tabs: [], active: 0 };
  }

  card.classList.add("terminal-live");
  for (const hidden of card.querySelectorAll("[data-needs-js]")) hidden.hidden = false;

  // Fill the window below the terminal's top, so the prompt line stays visible down to
  // 800x600; when little room is left under the page head, scroll the card to the top.
  function sizeToWindow(first) {
    if (card.classList.contains("terminal-full")) {
      area.style.height = "";
      return;
    }
    const top = area.getBoundingClientRect().top + window.scrollY;
    let height = window.innerHeight - top - 16;
    let scroll = false;
    if (height < MIN_HEIGHT * 1.5) {
      height = window.innerHeight - (area.getBoundingClientRect().top - card.getBoundingClientRect().top) - 16;
      scroll = first;
    }
    area.style.height = Math.max(Math.floor(height), MIN_HEIGHT) + "px";
    if (scroll) card.scrollIntoView({ block: "start" });
  }

  function showNotice(text) {
    noticeEl.textContent = text;
    noticeEl.hidden = !text;
  }

  // The status line, the badge and the offers follow the active tab.
  function paint() {
    const tab = active;
    if (!tab) return;
    stateEl.textContent = stateText(tab);
    stateEl.dataset.state = tab.state;
    modeEl.hidden = tab.state !== "connected";
    const offer = tab.ended ? tab.ended.offer : "";
    reconnectButton.hidden = !(offer === "new" || offer === "take");
    reconnectButton.textContent = offer === "take" ? "Take this shell back" : "Start a new shell";
    loginLink.hidden = offer !== "login";
    sessionsLink.hidden = offer !== "sessions";
    showNotice(tab.notice || "");
  }

  // "logged out: logged out everywhere" reads "logged out everywhere".
  function stateText(tab) {
    if (!tab.detail) return tab.state;
    return tab.detail.indexOf(tab.state) === 0 ? tab.detail : tab.state + ": " + tab.detail;
  }

  function makeTab(name, rememberedId) {
    const tab = {
      name: name,
      terminalId: rememberedId || null,
      state: "connecting",
      detail: "",
      notice: "",
      ended: null,
      socket: null,
      attempt: 0,
      connectedOnce: false,
      lastReason: "",
      lastCode: 0,
      pingTimer: null,
      pending: 0,
      sinceAck: 0,
      paused: false,
      closedByUser: false,
      kept: false,
      burst: 0, // output bytes since the scrollback was last known whole
      outputSeq: 0, // counts output frames: a history reply is stale once output came after it
      askedAt: -1,
      quietTimer: null,
    };
    const index = nextNumber++;
    tab.pane = document.createElement("div");
    tab.pane.className = "terminal-pane";
    tab.pane.id = "terminal-pane-" + index;
    tab.pane.setAttribute("role", "tabpanel");
    tab.button = document.createElement("button");
    tab.button.type = "button";
    tab.button.className = "terminal-tab";
    tab.button.id = "terminal-tab-" + index;
    tab.button.setAttribute("role", "tab");
    tab.button.setAttribute("aria-controls", tab.pane.id);
    tab.button.title = "Double-click or F2 to rename, Delete to close (ends its shell)";
    const dot = document.createElement("span");
    dot.className = "tab-dot";
    dot.setAttribute("aria-hidden", "true");
    tab.label = document.createElement("span");
    tab.label.className = "tab-label";
    tab.label.textContent = name;
    tab.button.appendChild(dot);
    tab.button.appendChild(tab.label);
    tab.pane.setAttribute("aria-labelledby", tab.button.id);
    tabList.appendChild(tab.button);
    area.appendChild(tab.pane);

    tab.button.addEventListener("click", function () {
      select(tab);
    });
    tab.button.addEventListener("dblclick", function () {
      rename(tab);
    });
    tab.button.addEventListener("keydown", function (event) {
      const at = tabs.indexOf(tab);
      if (event.key === "F2") rename(tab);
      else if (event.key === "Delete") closeTab(tab);
      else if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
        const next = tabs[(at + (event.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
        select(next);
        next.button.focus();
      } else return;
      event.preventDefault();
    });

    tab.term = new window.Terminal({
      cursorBlink: true,
      convertEol: false,
      scrollback: SCROLLBACK,
      fontFamily: "ui-monospace, monospace",
      fontSize: fontSize,
    });
    tab.fit = new window.FitAddon.FitAddon();
    tab.term.loadAddon(tab.fit);
    if (window.SearchAddon) {
      tab.search = new window.SearchAddon.SearchAddon();
      tab.term.loadAddon(tab.search);
    }
    tabs.push(tab);
    tab.term.open(tab.pane);
    tab.term.attachCustomKeyEventHandler(function (event) {
      return pageKeys(tab, event);
    });
    tab.term.onData(function (data) {
      sendBytes(tab, encoder.encode(data));
    });
    tab.term.onBinary(function (data) {
      const bytes = new Uint8Array(data.length);
      for (let i = 0; i < data.length; i += 1) bytes[i] = data.charCodeAt(i) & 0xff;
      sendBytes(tab, bytes);
    });
    tab.term.onResize(function () {
      sendSize(tab);
    });
    return tab;
  }

  function select(tab) {
    active = tab;
    for (const other of tabs) {
      const on = other === tab;
      other.pane.hidden = !on;
      other.button.setAttribute("aria-selected", on ? "true" : "false");
      other.button.tabIndex = on ? 0 : -1;
    }
    refit();
    paint();
    saveTabs();
    tab.term.focus();
  }

  function rename(tab) {
    const name = window.prompt("Name of this terminal", tab.name);
    if (name === null) return;
    const clean = name.trim().slice(0, 40);
    if (!clean) return;
    tab.name = clean;
    tab.label.textContent = clean;
    saveTabs();
  }

  function closeTab(tab) {
    tab.closedByUser = true;
    clearInterval(tab.pingTimer);
    if (tab.socket) tab.socket.close(CLOSE_END_SHELL, "tab closed");
    tab.socket = null;
    tab.term.dispose();
    tab.pane.remove();
    tab.button.remove();
    const at = tabs.indexOf(tab);
    tabs.splice(at, 1);
    if (!tabs.length) {
      const fresh = makeTab(freshName(), null);
      select(fresh);
      connect(fresh);
      return;
    }
    if (active === tab) select(tabs[Math.max(at - 1, 0)]);
    saveTabs();
  }

  function freshName() {
    const taken = new Set(
      tabs.map(function (tab) {
        return tab.name;
      })
    );
    for (let n = 1; ; n += 1) if (!taken.has("Shell " + n)) return "Shell " + n;
  }

  function setState(tab, next, detail) {
    tab.state = next;
    tab.detail = detail || "";
    tab.button.querySelector(".tab-dot").dataset.state = next;
    if (tab === active) paint();
  }

  // The end of a shell (or of the way to it), in words that say what happened.
  function ended(tab, code, reason) {
    const ending = ENDINGS[code] || { state: "closed", offer: "new" };
    tab.ended = ending;
    tab.terminalId = ending.offer === "take" ? tab.terminalId : null; // over: a new one next
    saveTabs();
    if (ending.own) reason = ending.words; // the words say it better than the server's
    setState(tab, ending.state, reason || ending.words || "");
    if (code === 4001 || code === 401) {
      // Logged out here or elsewhere: every tab's shell is over, and typing goes nowhere.
      for (const other of tabs) other.term.options.disableStdin = true;
    }
    tab.term.write("\r\n\x1b[33m[" + stateEl.textContent + "]\x1b[0m\r\n");
  }

  function sendControl(tab, message) {
    if (tab.socket && tab.socket.readyState === WebSocket.OPEN) tab.socket.send(JSON.stringify(message));
  }

  function sendBytes(tab, bytes) {
    if (!tab.socket || tab.socket.readyState !== WebSocket.OPEN) return;
    for (let i = 0; i < bytes.length; i += MAX_FRAME) tab.socket.send(bytes.subarray(i, i + MAX_FRAME));
  }

  function sendSize(tab) {
    sendControl(tab, { type: "resize", cols: tab.term.cols, rows: tab.term.rows });
  }

  function noteOutput(tab, length) {
    tab.outputSeq += 1;
    tab.burst += length;
    clearTimeout(tab.quietTimer);
    if (tab.kept && tab.burst >= RESYNC_BYTES) {
      tab.quietTimer = setTimeout(function () {
        askHistory(tab);
      }, QUIET_MS);
    }
  }

  function askHistory(tab) {
    if (tab.term.buffer.active.type !== "normal") return; // a full-screen program: no scrollback
    tab.askedAt = tab.outputSeq;
    tab.burst = 0;
    sendControl(tab, { type: "history" });
  }

  // Rebuild the scrollback from the shell's history, then put back the screen and cursor
  // tmux holds, leaving the terminal's modes alone (no reset).
  function applyHistory(tab, message) {
    if (!message.kept) {
      tab.kept = false;
      return;
    }
    // Busy, or output came meanwhile (a late prompt under load is often the last output):
    // ask again after a quiet moment; more output pushes the question back (noteOutput).
    if (typeof message.history !== "string" || tab.outputSeq !== tab.askedAt) {
      tab.burst = RESYNC_BYTES;
      clearTimeout(tab.quietTimer);
      tab.quietTimer = setTimeout(function () {
        askHistory(tab);
      }, QUIET_MS);
      return;
    }
    const buffer = tab.term.buffer.active;
    if (buffer.type !== "normal") return;
    const have = buffer.length - tab.term.rows;
    const past = message.history ? message.history.replace(/\n$/, "").split("\n") : [];
    const plain = function (text) {
      return text.replace(/\x1b\[[0-9;:?]*[A-Za-z]/g, "").replace(/\s+$/, "");
    };
    const lastPast = past.length ? plain(past[past.length - 1]) : "";
    const lastHere = have > 0 ? buffer.getLine(have - 1).translateToString(true).replace(/\s+$/, "") : "";
    if (have === Math.min(message.lines, SCROLLBACK) && lastPast === lastHere) return; // nothing went missing
    let out = "\x1b[0m\x1b[3J\x1b[H\x1b[2J";
    for (const line of past) out += line + "\x1b[0m\r\n";
    out += "\n".repeat(Math.max(tab.term.rows - 1, 0)); // every line above into the scrollback
    const screen = message.screen ? message.screen.split("\n") : [];
    for (let i = 0; i < screen.length && i < tab.term.rows; i += 1) {
      out += "\x1b[" + (i + 1) + ";1H\x1b[2K" + screen[i] + "\x1b[0m";
    }
    const cursor = message.cursor || [0, 0];
    out += "\x1b[" + (cursor[1] + 1) + ";" + (cursor[0] + 1) + "H";
    tab.term.write(out);
  }

  function writeOutput(tab, bytes) {
    noteOutput(tab, bytes.length);
    tab.sinceAck += bytes.length;
    if (tab.sinceAck < ACK_BYTES) {
      tab.term.write(bytes);
      return;
    }
    tab.sinceAck = 0;
    tab.pending += 1;
    if (tab.pending > HIGH && !tab.paused) {
      tab.paused = true;
      sendControl(tab, { type: "pause" });
    }
    tab.term.write(bytes, function () {
      tab.pending = Math.max(tab.pending - 1, 0);
      if (tab.pending < LOW && tab.paused) {
        tab.paused = false;
        sendControl(tab, { type: "resume" });
      }
    });
  }

  async function fetchTicket(tab) {
    let response = await askTicket(tab.terminalId);
    if (tab.terminalId && !tab.connectedOnce && (response.status === 404 || response.status === 410)) {
      // The remembered terminal (before a reload) is over: open a new one.
      tab.terminalId = null;
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
      redirect: "manual",
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
      // A redirect (to the login page) means the login session is over.
      const status = response.type === "opaqueredirect" ? 401 : response.status;
      const error = new Error(data.error || "HTTP " + status);
      error.status = status;
      error.final = status >= 400 && status < 500;
      throw error;
    }
    return data;
  }

  async function connect(tab) {
    if (stopped || tab.closedByUser) return;
    tab.ended = null;
    tab.term.options.disableStdin = false;
    setState(tab, tab.attempt === 0 ? "connecting" : "reconnecting", tab.attempt ? "attempt " + tab.attempt : "");
    let grant;
    try {
      grant = await fetchTicket(tab);
    } catch (err) {
      if (err.final) {
        ended(tab, err.status, err.message);
        return;
      }
      scheduleReconnect(tab);
      return;
    }
    tab.terminalId = grant.terminal_id;
    saveTabs();
    const ws = new WebSocket(grant.ws_url + "?ticket=" + encodeURIComponent(grant.ticket));
    ws.binaryType = "arraybuffer";
    tab.socket = ws;
    ws.onopen = function () {
      sendSize(tab); // queued by the server until the shell runs; re-sent after every reconnect
      clearInterval(tab.pingTimer);
      tab.pingTimer = setInterval(function () {
        sendControl(tab, { type: "ping" });
      }, PING_MS);
    };
    ws.onmessage = function (event) {
      if (typeof event.data !== "string") {
        writeOutput(tab, new Uint8Array(event.data));
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
          if (tab.connectedOnce) tab.term.reset(); // the replay that follows redraws the screen
          tab.connectedOnce = true;
          tab.attempt = 0;
          tab.paused = false;
          tab.pending = 0;
          tab.notice = message.replaced ? message.message : "";
          tab.kept = Boolean(message.kept);
          tab.burst = 0;
          setState(tab, "connected", message.replaced ? "new shell" : message.reattached ? "reattached" : "");
          if (message.replaced) tab.term.write("\x1b[33m[" + message.message + "]\x1b[0m\r\n");
          if (tab === active) tab.term.focus();
        } else if (message.state === "starting") {
          setState(tab, "connecting", "starting the shell");
        } else if (message.state === "closed") {
          tab.lastReason = message.reason || "";
          tab.lastCode = message.code || 0;
        }
      } else if (message.type === "history") {
        applyHistory(tab, message);
      } else if (message.type === "error") {
        tab.term.write("\r\n\x1b[31m" + (message.message || "error") + "\x1b[0m\r\n");
      }
    };
    ws.onclose = function (event) {
      clearInterval(tab.pingTimer);
      if (tab.socket !== ws) return;
      tab.socket = null;
      if (stopped || tab.closedByUser) return;
      if (RETRY_CODES.has(event.code)) {
        scheduleReconnect(tab);
        return;
      }
      const code = tab.lastCode || event.code;
      tab.lastCode = 0;
      ended(tab, code, tab.lastReason || event.reason || (ENDINGS[code] ? "" : "code " + code));
      tab.lastReason = "";
    };
  }

  function scheduleReconnect(tab) {
    if (tab.attempt >= BACKOFF_MS.length) {
      ended(tab, 0, "could not reconnect");
      return;
    }
    const delay = BACKOFF_MS[tab.attempt];
    tab.attempt += 1;
    setState(tab, "reconnecting", "attempt " + tab.attempt + " in " + delay / 1000 + " s");
    setTimeout(function () {
      connect(tab);
    }, delay);
  }

  // Keys the page takes before the shell sees them; false keeps them from the shell.
  function pageKeys(tab, event) {
    if (event.type !== "keydown") return true;
    const ctrl = event.ctrlKey || event.metaKey;
    const key = event.key.toLowerCase();
    if (ctrl && event.shiftKey && key === "c") {
      copySelection(tab);
      event.preventDefault();
      return false;
    }
    if (ctrl && event.shiftKey && key === "v") {
      return false; // the browser's own paste event follows; xterm.js sends it as a paste
    }
    if (ctrl && event.shiftKey && key === "f") {
      openSearch();
      event.preventDefault();
      return false;
    }
    if (ctrl && !event.shiftKey && (key === "=" || key === "+" || key === "-")) {
      setFont(fontSize + (key === "-" ? -1 : 1));
      event.preventDefault();
      return false;
    }
    if (event.metaKey && key === "c" && tab.term.hasSelection()) return false; // ⌘C copies natively
    return true;
  }

  function copySelection(tab) {
    const text = tab.term.getSelection();
    if (!text) return;
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).catch(function () {});
      return;
    }
    const field = document.createElement("textarea");
    field.value = text;
    document.body.appendChild(field);
    field.select();
    try {
      document.execCommand("copy");
    } catch (err) {
      // the browser refused: the selection stays for the context menu
    }
    field.remove();
    tab.term.focus();
  }

  function setFont(size) {
    fontSize = Math.min(Math.max(size, FONT_MIN), FONT_MAX);
    for (const tab of tabs) tab.term.options.fontSize = fontSize;
    try {
      window.localStorage.setItem(FONT_KEY, String(fontSize));
    } catch (err) {
      // not kept
    }
    refit();
  }

  function openSearch() {
    searchForm.hidden = false;
    searchToggle.setAttribute("aria-expanded", "true");
    searchInput.focus();
    searchInput.select();
    refit();
  }

  function closeSearch() {
    searchForm.hidden = true;
    searchToggle.setAttribute("aria-expanded", "false");
    searchResult.textContent = "";
    if (active && active.search) active.search.clearDecorations();
    refit();
    if (active) active.term.focus();
  }

  function find(backwards) {
    if (!active || !active.search || !searchInput.value) return;
    const options = { caseSensitive: false, incremental: false };
    const found = backwards
      ? active.search.findPrevious(searchInput.value, options)
      : active.search.findNext(searchInput.value, options);
    searchResult.textContent = found ? "" : "not found";
  }

  function setFull(on) {
    card.classList.toggle("terminal-full", on);
    fullButton.setAttribute("aria-pressed", on ? "true" : "false");
    fullButton.textContent = on ? "Leave full screen" : "Full screen";
    refit();
    if (active) active.term.focus();
  }

  function refit() {
    sizeToWindow(false);
    if (!active) return;
    try {
      active.fit.fit();
    } catch (err) {
      // not laid out yet
    }
  }

  searchToggle.addEventListener("click", function () {
    if (searchForm.hidden) openSearch();
    else closeSearch();
  });
  searchForm.addEventListener("submit", function (event) {
    event.preventDefault();
    find(false);
  });
  searchInput.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      event.preventDefault();
      closeSearch();
    } else if (event.key === "Enter" && event.shiftKey) {
      event.preventDefault();
      find(true);
    }
  });
  document.getElementById("terminal-search-prev").addEventListener("click", function () {
    find(true);
  });
  document.getElementById("terminal-search-close").addEventListener("click", closeSearch);
  document.getElementById("terminal-font-up").addEventListener("click", function () {
    setFont(fontSize + 1);
  });
  document.getElementById("terminal-font-down").addEventListener("click", function () {
    setFont(fontSize - 1);
  });
  fullButton.addEventListener("click", function () {
    const on = !card.classList.contains("terminal-full");
    if (on && card.requestFullscreen) {
      card.requestFullscreen().catch(function () {
        setFull(true); // refused (an iframe, an old browser): fill the window instead
      });
    } else if (!on && document.fullscreenElement) {
      document.exitFullscreen();
    } else {
      setFull(on);
    }
  });
  document.addEventListener("fullscreenchange", function () {
    setFull(document.fullscreenElement === card);
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && card.classList.contains("terminal-full") && !document.fullscreenElement) setFull(false);
  });
  document.getElementById("terminal-new-tab").addEventListener("click", function () {
    if (tabs.length >= MAX_TABS) {
      showNotice("At most " + MAX_TABS + " terminals per page.");
      return;
    }
    const tab = makeTab(freshName(), null);
    select(tab);
    connect(tab);
  });
  document.getElementById("terminal-close-tab").addEventListener("click", function () {
    if (active) closeTab(active);
  });
  document.getElementById("terminal-copy").addEventListener("click", function () {
    if (active) copySelection(active);
    if (active) active.term.focus();
  });
  document.getElementById("terminal-paste").addEventListener("click", async function () {
    if (!active) return;
    if (navigator.clipboard && navigator.clipboard.readText) {
      try {
        active.term.paste(await navigator.clipboard.readText());
      } catch (err) {
        // clipboard permission refused: Ctrl+Shift+V / the browser's paste still work
      }
    }
    active.term.focus();
  });
  reconnectButton.addEventListener("click", function () {
    const tab = active;
    if (!tab) return;
    const take = tab.ended && tab.ended.offer === "take";
    tab.attempt = 0;
    tab.lastReason = "";
    tab.notice = "";
    if (!take) {
      tab.term.reset();
      tab.connectedOnce = false;
      tab.terminalId = null;
    }
    connect(tab);
  });
  window.addEventListener("resize", refit);
  if (window.ResizeObserver) new ResizeObserver(refit).observe(card);
  window.addEventListener("pagehide", function () {
    stopped = true;
    // A reload cannot be told from leaving: keep the shells for the grace window either way.
    for (const tab of tabs) if (tab.socket) tab.socket.close(CLOSE_PAGE_LEFT, "page left");
  });

  sizeToWindow(true);
  const saved = savedTabs();
  const wanted = saved.tabs.length ? saved.tabs : [{ id: null, name: "Shell 1" }];
  for (const entry of wanted.slice(0, MAX_TABS)) makeTab(String(entry.name || freshName()).slice(0, 40), entry.id);
  select(tabs[Math.min(Math.max(saved.active || 0, 0), tabs.length - 1)]);
  for (const tab of tabs) connect(tab);

  // For tests and the curious: the active tab's xterm object and connection state.
  window.consoleTerminal = {
    get term() {
      return active.term;
    },
    get fit() {
      return active.fit;
    },
    state: function () {
      return active.state;
    },
    terminalId: function () {
      return active.terminalId;
    },
    tabs: function () {
      return tabs.map(function (tab) {
        return { name: tab.name, state: tab.state, terminalId: tab.terminalId };
      });
    },
    select: function (index) {
      select(tabs[index]);
    },
    fontSize: function () {
      return fontSize;
    },
    // Whether the shell is kept (tmux) and where the scrollback's repair stands.
    scrollback: function () {
      return { kept: active.kept, burst: active.burst, outputSeq: active.outputSeq, askedAt: active.askedAt };
    },
  };
})();
