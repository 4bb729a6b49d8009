// Corral's live-view client (BROW-2, BROW-8, BROW-10, BROW-11): the session's screen over
// relay-only WebRTC, and the member's pointer and keys over its data channel.
//
// It speaks to the API's signaling relay beside this page, with the ticket this page was loaded
// with. The relay sends the ICE configuration (the session's one TURN authority and credential,
// "relay" only); the page offers to receive video and opens the "input" channel, waits for its
// candidates to be gathered, and sends the offer whole. Positions are sent as fractions of the
// picture as shown (letterboxing excluded), so they map onto the desktop's device pixels
// whatever size the pane is. Nothing is stored: no cookie, no local storage.
"use strict";

(function () {
  const video = document.getElementById("screen");
  const status = document.getElementById("status");
  const ticket = new URLSearchParams(location.search).get("ticket") || "";
  const base = location.pathname.replace(/\/viewport\/.*$/, "");
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const view = {
    state: "connecting",
    closed: null,
    errors: [],
    pc: null,
    channel: null,
    sent: 0,
    firstFrameAt: null,
    username: null,
    renewed: 0,
    activity: 0,
  };
  window.corralViewer = view;

  function say(text) {
    view.state = text;
    status.textContent = text;
  }

  const socket = new WebSocket(scheme + "//" + location.host + base + "/signal?ticket=" + encodeURIComponent(ticket));

  socket.onmessage = async (event) => {
    let message;
    try {
      message = JSON.parse(event.data);
    } catch (e) {
      return;
    }
    if (message.t === "config") {
      // A renewed credential comes as a new config: connect again through the new relay.
      if (view.pc) {
        view.pc.close();
        view.renewed += 1;
      }
      view.username = message.ice_servers[0] && message.ice_servers[0].username;
      activityEvery = message.activity_every_ms || activityEvery;
      await start(message);
    } else if (message.t === "answer") {
      await view.pc.setRemoteDescription({ type: "answer", sdp: message.sdp });
      say("connecting media");
    } else if (message.t === "error") {
      view.errors.push(message.code);
      say("refused: " + message.code);
    } else if (message.t === "closed") {
      view.closed = message.code;
      say("closed: " + message.code);
    }
  };
  socket.onclose = (event) => {
    if (!view.closed) {
      view.closed = event.reason || "signaling_closed";
    }
    say("closed: " + view.closed);
  };

  async function start(config) {
    const pc = new RTCPeerConnection({
      iceServers: config.ice_servers,
      iceTransportPolicy: "relay",
    });
    view.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const channel = pc.createDataChannel("input", { ordered: true });
    view.channel = channel;
    channel.onopen = () => pane();
    pc.ontrack = (event) => {
      video.srcObject = event.streams[0] || new MediaStream([event.track]);
      video.play().catch(() => {});
      // When the first frame was shown (wall clock, milliseconds), for whoever measures.
      if (video.requestVideoFrameCallback) {
        video.requestVideoFrameCallback(() => { view.firstFrameAt = Date.now(); });
      }
    };
    pc.onconnectionstatechange = () => say(pc.connectionState);
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
    socket.send(JSON.stringify({ t: "offer", sdp: pc.localDescription.sdp }));
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
})();
