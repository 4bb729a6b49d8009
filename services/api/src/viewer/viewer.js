// Corral's live-view client (BROW-2, BROW-8, BROW-10, BROW-11, BROW-12): the session's screen
// over relay-only WebRTC, and the member's pointer and keys over its data channel.
//
// It speaks to the API's signaling relay beside this page, with the ticket this page was loaded
// with. The relay sends the ICE configuration (the session's one TURN authority and credential,
// "relay" only); the page offers to receive video and opens the "input" channel, waits for its
// candidates to be gathered, and sends the offer whole. Positions are sent as fractions of the
// picture as shown (letterboxing excluded), so they map onto the desktop's device pixels
// whatever size the pane is. Nothing is stored: no cookie, no local storage.
//
// Closing: the relay closes with a stable code and says whether the page should connect again
// (corral_core::browser::viewer::after_close). A standing reason (another member's private text,
// the session's end, a ticket no longer good) stays on the page, in words, with its code in
// #status's data-code, and the page makes no new connection. A passing one (a renewed
// credential, a dropped connection, a worker or store that did not answer) is retried after
// RETRY_MS, a bounded number of times; before each try the page asks for itself again, so a
// reason that now stands (the ticket expired, the session ended) is read and kept.
"use strict";

(function () {
  const video = document.getElementById("screen");
  const status = document.getElementById("status");
  const statusText = document.getElementById("status-text");
  const statusCode = document.getElementById("status-code");
  const notice = document.getElementById("notice");
  const ticket = new URLSearchParams(location.search).get("ticket") || "";
  const base = location.pathname.replace(/\/viewport\/.*$/, "");
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const signalUrl = scheme + "//" + location.host + base + "/signal?ticket=" + encodeURIComponent(ticket);
  // The delays before each try to connect again after a passing close; then the page gives up.
  const RETRY_MS = [1000, 2000, 4000, 8000, 16000];
  // Every code the page can show, in words a member reads; the code itself stays beside them.
  const SENTENCES = {
    connecting: "Connecting to the live view…",
    offered: "Connecting to the live view…",
    answered: "Connecting to the live view…",
    new: "Connecting to the live view…",
    connected: "Live.",
    disconnected: "The picture is interrupted; waiting for it to come back…",
    failed: "The picture was lost; reconnecting…",
    closed: "The live view is closed.",
    reconnecting: "The connection to the live view was interrupted; reconnecting…",
    signaling_lost: "The connection to the live view was lost. Reload this page to try again.",
    private_text: "Another member is viewing private text, so the live view is paused for you. Reload this page to watch again once they are done.",
    session_not_found: "The session has ended.",
    viewer_ticket_expired: "This viewer link has expired. Ask for a new one to keep watching.",
    viewer_ticket_invalid: "This viewer link is not valid for this session.",
    live_view_stopped: "The session's live view has stopped.",
    viewers_full: "Too many members are watching this session already. Try again later.",
    sdp_invalid: "This browser could not set up the live view.",
    signal_invalid: "This page could not talk to the live view.",
    live_view_unreachable: "The session's computer did not answer; reconnecting…",
    live_view_refused: "The live view refused this viewer; reconnecting…",
    coordination_unavailable: "The service is briefly unavailable; reconnecting…",
  };
  // Passing reasons shown by their own words while the page connects again.
  const PASSING = ["failed", "live_view_unreachable", "live_view_refused", "coordination_unavailable"];
  const view = {
    state: "connecting",
    // The code shown now (also #status's data-code).
    code: "connecting",
    // The last close's code, and whether it stands (no more connections).
    closed: null,
    final: false,
    errors: [],
    pc: null,
    channel: null,
    sent: 0,
    firstFrameAt: null,
    username: null,
    renewed: 0,
    activity: 0,
    // The signaling relay's socket now; signaling connections opened, and connections again
    // after a passing close.
    socket: null,
    connections: 0,
    reconnects: 0,
    retryMs: RETRY_MS,
    // The adapter's answers to this viewer's pane messages (BROW-11): the last 64, and how many.
    panes: [],
    paneAnswers: 0,
  };
  window.corralViewer = view;

  // Shows `code` in words (the server's `message` for a code the page does not know).
  function show(code, message) {
    view.code = code;
    status.dataset.code = code;
    statusCode.textContent = code;
    statusText.textContent = SENTENCES[code] || message || code;
  }

  // A step of the connection: shown unless a standing reason is.
  function say(state) {
    view.state = state;
    if (!view.final) {
      show(state);
    }
  }

  // A standing reason: kept on the page, over the picture; nothing connects again.
  function stand(code, message) {
    view.final = true;
    view.closed = code;
    view.state = "closed";
    clearTimeout(retryTimer);
    show(code, message);
    notice.textContent = statusText.textContent;
    notice.hidden = false;
    if (socket && socket.readyState <= WebSocket.OPEN) {
      socket.close();
    }
  }

  let socket = null;
  let retries = 0;
  let retryTimer = null;

  function connect() {
    view.connections += 1;
    const ws = new WebSocket(signalUrl);
    ws.configured = false;
    socket = ws;
    view.socket = ws;
    ws.onmessage = (event) => signal(ws, event);
    ws.onclose = (event) => {
      if (ws !== socket || view.final) {
        return;
      }
      // A close frame without the message before it still names its code and kind.
      const code = ws.closedWith || event.reason || "signaling_lost";
      if (event.code === 4403 && !ws.closedWith) {
        stand(code);
        return;
      }
      view.closed = code;
      again(code);
    };
  }

  // Connects again after the next delay, or gives up after the last.
  function again(code) {
    if (view.pc) {
      view.pc.close();
      view.pc = null;
      view.channel = null;
    }
    if (retries >= RETRY_MS.length) {
      stand("signaling_lost");
      return;
    }
    view.state = "reconnecting";
    // A passing reason the page has words for, else the plain "reconnecting"; the code that
    // closed the relay stays in view.closed.
    show(PASSING.includes(code) ? code : "reconnecting");
    retryTimer = setTimeout(retry, RETRY_MS[retries]);
    retries += 1;
  }

  // Asks for this page again first: a refusal now names a reason that stands.
  async function retry() {
    let answer;
    try {
      answer = await fetch(location.pathname + location.search, { cache: "no-store", credentials: "omit" });
    } catch (e) {
      again("signaling_lost");
      return;
    }
    if (answer.ok) {
      view.reconnects += 1;
      connect();
      return;
    }
    let error = {};
    try {
      error = (await answer.json()).error || {};
    } catch (e) {
      error = {};
    }
    if (answer.status >= 400 && answer.status < 500) {
      stand(error.code || "signaling_lost", error.message);
    } else {
      again(error.code || "live_view_unreachable");
    }
  }

  async function signal(ws, event) {
    if (ws !== socket || view.final) {
      return;
    }
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    if (message.t === "config") {
      retries = 0;
      // A renewed credential comes as a new config on the same relay: connect again through the
      // worker's new relay.
      if (view.pc) {
        view.pc.close();
        view.pc = null;
      }
      if (ws.configured) {
        view.renewed += 1;
      }
      ws.configured = true;
      view.username = message.ice_servers[0] && message.ice_servers[0].username;
      activityEvery = message.activity_every_ms || activityEvery;
      await start(ws, message);
    } else if (message.t === "answer") {
      await view.pc.setRemoteDescription({ type: "answer", sdp: message.sdp });
      say("answered");
    } else if (message.t === "error") {
      view.errors.push(message.code);
      if (message.reconnect) {
        ws.closedWith = message.code;
        ws.close();
      } else {
        stand(message.code, message.message);
      }
    } else if (message.t === "closed") {
      ws.closedWith = message.code;
      view.closed = message.code;
      if (!message.reconnect) {
        stand(message.code, message.message);
      }
    }
  }

  async function start(ws, config) {
    const pc = new RTCPeerConnection({
      iceServers: config.ice_servers,
      iceTransportPolicy: "relay",
    });
    view.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel("input", { ordered: true });
    view.channel = channel;
    channel.onopen = () => pane();
    channel.onmessage = (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (message.t === "pane") {
        view.paneAnswers += 1;
        view.panes.push(message);
        view.panes.splice(0, view.panes.length - 64);
      }
    };
    pc.ontrack = (event) => {
      video.srcObject = event.streams[0] || new MediaStream([event.track]);
      video.play().catch(() => {});
      // When the first frame was shown (wall clock, milliseconds), for whoever measures.
      if (video.requestVideoFrameCallback) {
        video.requestVideoFrameCallback(() => { view.firstFrameAt = Date.now(); });
      }
    };
    pc.onconnectionstatechange = () => {
      // A peer replaced or a reason standing: its states are no longer what the page says.
      if (pc !== view.pc || view.final) {
        return;
      }
      say(pc.connectionState);
      if (pc.connectionState === "failed" && ws === socket) {
        ws.closedWith = "failed";
        ws.close();
      }
    };
    const gathered = new Promise((resolve) => {
      if (pc.iceGatheringState === "complete") {
        resolve();
      }
      pc.onicegatheringstatechange = () => {
        if (pc.iceGatheringState === "complete") {
          resolve();
        }
      };
    });
    await pc.setLocalDescription(await pc.createOffer());
    await gathered;
    if (ws !== socket || pc !== view.pc || ws.readyState !== WebSocket.OPEN) {
      return;
    }
    ws.send(JSON.stringify({ t: "offer", sdp: pc.localDescription.sdp }));
    say("offered");
  }

  // Input says on the signaling relay, now and then, that the member is at work, so that the
  // session is not reaped as idle while a member uses it.
  let activityEvery = 60000;
  let activityAt = 0;
  function send(message, input = true) {
    if (view.channel && view.channel.readyState === "open") {
      view.channel.send(JSON.stringify(message));
      view.sent += 1;
      if (input && Date.now() - activityAt >= activityEvery && socket.readyState === WebSocket.OPEN) {
        activityAt = Date.now();
        socket.send(JSON.stringify({ t: "activity" }));
        view.activity += 1;
      }
    }
  }

  // Where (x, y) in the element falls in the picture, as fractions; null in the letterbox.
  function fraction(event) {
    const box = video.getBoundingClientRect();
    const w = video.videoWidth;
    const h = video.videoHeight;
    if (!w || !h) {
      return null;
    }
    const scale = Math.min(box.width / w, box.height / h);
    const left = box.left + (box.width - w * scale) / 2;
    const top = box.top + (box.height - h * scale) / 2;
    const x = (event.clientX - left) / (w * scale);
    const y = (event.clientY - top) / (h * scale);
    if (x < 0 || x > 1 || y < 0 || y > 1) {
      return null;
    }
    return { x, y };
  }

  // The pane in CSS pixels and the device pixel ratio: the driver's sets the desktop's size, so
  // that its pixels are the member's (BROW-5). Sent when the channel opens and as the pane
  // changes, at most every 200 ms.
  let paneTimer = null;
  function pane() {
    send({ t: "pane", width: video.clientWidth, height: video.clientHeight, ratio: window.devicePixelRatio || 1 }, false);
  }
  new ResizeObserver(() => {
    clearTimeout(paneTimer);
    paneTimer = setTimeout(pane, 200);
  }).observe(video);

  const buttons = { 0: 1, 1: 2, 2: 3 };
  video.addEventListener("pointermove", (event) => {
    const at = fraction(event);
    if (at) {
      send({ t: "move", x: at.x, y: at.y });
    }
  });
  for (const [type, down] of [["pointerdown", true], ["pointerup", false]]) {
    video.addEventListener(type, (event) => {
      const at = fraction(event);
      const button = buttons[event.button];
      if (at && button) {
        video.focus();
        send({ t: "button", x: at.x, y: at.y, button, down });
        event.preventDefault();
      }
    });
  }
  video.addEventListener("wheel", (event) => {
    const at = fraction(event);
    if (at && event.deltaY !== 0) {
      send({ t: "wheel", x: at.x, y: at.y, dy: event.deltaY > 0 ? 1 : -1 });
      event.preventDefault();
    }
  }, { passive: false });
  video.addEventListener("contextmenu", (event) => event.preventDefault());
  for (const [type, down] of [["keydown", true], ["keyup", false]]) {
    video.addEventListener(type, (event) => {
      send({ t: "key", code: event.code, down });
      event.preventDefault();
    });
  }

  connect();
})();
