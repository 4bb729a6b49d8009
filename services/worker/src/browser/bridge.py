# The browser bridge (BROW-1, BROW-10): runs as the jail's program for a browser session. It starts
# an X display with virtual input (Xvfb, XTest), Openbox, PulseAudio and one headed Chromium with
# a fresh profile, owns that Chromium over an inherited pipe (--remote-debugging-pipe: fds 3 and 4,
# NUL-delimited JSON, no debugger socket), and answers the supervisor's actions: one JSON line in
# on stdin, one JSON line out on stdout. Standard library only. It holds no credential: the
# egress grant stays with the worker's relay, which Chromium reaches as its proxy.
import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time

PARAMS = json.loads(base64.b64decode(sys.argv[1]))
PROGRAMS = PARAMS["programs"]
OUT = sys.stdout
CHILDREN = []


def say(obj):
    OUT.write(json.dumps(obj, separators=(",", ":")) + "\n")
    OUT.flush()


class Failure(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def spawn(argv, env=None, pass_fds=(), preexec=None):
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        pass_fds=pass_fds,
        preexec_fn=preexec,
        close_fds=True,
    )
    CHILDREN.append(child)
    return child


def wait_for(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise Failure("runtime_start_failed", what + " did not start")


class Cdp:
    """The DevTools protocol over the inherited pipe."""

    def __init__(self, write_fd, read_fd):
        self.w = write_fd
        self.r = read_fd
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None
        self.page = None
        # The last main-document response, for the navigation's status and the proxy's refusal.
        self.document = None

    def write(self, method, params=None, session=True):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        data = json.dumps(message).encode() + b"\0"
        while data:
            n = os.write(self.w, data)
            data = data[n:]
        return self.next_id

    def send(self, method, params=None, session=True, timeout=None):
        return self.send_all([(method, params, session)], timeout)[0]

    def send_all(self, commands, timeout=None, tolerate=False):
        """Writes every (method, params, session) command at once, then waits for each answer.
        An error answer raises, or with `tolerate` stands as {"__error__": message}."""
        waiting = {self.write(method, params, session): method for method, params, session in commands}
        order = list(waiting)
        results = {}
        deadline = time.monotonic() + (timeout if timeout is not None else PARAMS["step_seconds"])
        while waiting:
            reply = self.read(deadline)
            if reply is None:
                raise Failure("action_timed_out", ", ".join(waiting.values()) + " did not answer in time")
            method = waiting.pop(reply.get("id"), None)
            if method is not None:
                if "error" in reply:
                    message = method + ": " + str(reply["error"].get("message", ""))[:300]
                    if not tolerate:
                        raise Failure("browser_error", message)
                    results[reply["id"]] = {"__error__": message}
                    continue
                results[reply["id"]] = reply.get("result", {})
            elif "method" in reply:
                self.events.append(reply)
                del self.events[:-200]
        return [results[ident] for ident in order]

    def read(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise Failure("browser_gone", "the browser closed its pipe")
            self.buf += chunk
        message, self.buf = self.buf.split(b"\0", 1)
        message = json.loads(message)
        if message.get("method") == "Network.responseReceived" \
                and message.get("params", {}).get("type") == "Document":
            self.document = message["params"].get("response", {})
        return message

    def wait_until(self, matches, seconds):
        """The first event, kept or arriving within `seconds`, that `matches`; None after."""
        deadline = time.monotonic() + seconds
        while True:
            for i, event in enumerate(self.events):
                if matches(event):
                    del self.events[: i + 1]
                    return event
            event = self.read(deadline)
            if event is None:
                return None
            if "method" in event:
                self.events.append(event)

    def wait_event(self, names, seconds):
        return self.wait_until(lambda e: e.get("method") in names, seconds)


PHASES = {}
OPENBOX_RC = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <applications>
    <application class="*">
      <decor>no</decor>
      <maximized>true</maximized>
    </application>
  </applications>
</openbox_config>
"""


def start():
    display = ":%d" % PARAMS["display"]
    width, height = PARAMS["width"], PARAMS["height"]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": PARAMS["home"],
        "TMPDIR": "/tmp",
        "DISPLAY": display,
        "XDG_RUNTIME_DIR": PARAMS["runtime_dir"],
        "LANG": "C.UTF-8",
    }
    os.makedirs(PARAMS["runtime_dir"], mode=0o700, exist_ok=True)
    socket = "/tmp/.X11-unix/X%d" % PARAMS["display"]
    # The display starts as large as a capture can be, so that a mode change can grow it as well
    # as shrink it; the worker then sets its mode to the capture through RandR, the live view's
    # way (BROW-5), before the window manager and Chromium come up at that size.
    screen_width, screen_height = PARAMS["screen"]
    spawn([PROGRAMS["xvfb"], display, "-screen", "0", "%dx%dx24" % (screen_width, screen_height),
           "-nolisten", "tcp", "-noreset", "+extension", "XTEST", "+extension", "RANDR"], env)
    wait_for(lambda: os.path.exists(socket), 10, "the X display")
    say({"display": True})
    if sys.stdin.readline().strip() != "go":
        raise Failure("runtime_start_failed", "the worker did not set the screen's mode")
    PHASES["display"] = time.monotonic()
    # Every window maximized and undecorated: Chromium's window is the screen, and follows the
    # screen's mode when it changes (BROW-5).
    rc = os.path.join(PARAMS["home"], "openbox-rc.xml")
    os.makedirs(PARAMS["home"], exist_ok=True)
    with open(rc, "w") as config:
        config.write(OPENBOX_RC)
    spawn([PROGRAMS["openbox"], "--config-file", rc], env)
    spawn([PROGRAMS["pulseaudio"], "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit",
           "-n", "--load=module-null-sink sink_name=corral", "--load=module-native-protocol-unix"], env)
    # The profile's preferences: no search provider and no prediction (its preconnects), no
    # sign-in, no suggestions, no safe-browsing or error-page lookups (BROW-3).
    os.makedirs(os.path.join(PARAMS["profile"], "Default"), exist_ok=True)
    with open(os.path.join(PARAMS["profile"], "Default", "Preferences"), "w") as prefs:
        json.dump({
            "net": {"network_prediction_options": 2},
            "signin": {"allowed": False, "allowed_on_next_startup": False},
            "search": {"suggest_enabled": False},
            "alternate_error_pages": {"enabled": False},
            "safebrowsing": {"enabled": False},
            "translate": {"enabled": False},
            "browser": {"has_seen_welcome_page": True},
            "default_search_provider": {"enabled": False},
        }, prefs)
    # The pipe: Chromium reads commands on fd 3 and writes on fd 4.
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()

    def fds():
        # Above every descriptor first, so that neither end is overwritten by the other.
        r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.dup2(r, 3)
        os.dup2(w, 4)

    flags = [
        "--remote-debugging-pipe",
        "--user-data-dir=" + PARAMS["profile"],
        # Chromium's own sandbox needs user namespaces, which the jail refuses to everything in
        # it; the jail is the session's boundary (decision 0027). The managed policy
        # CommandLineFlagSecurityWarningsEnabled=false keeps the flag's warning bar off the
        # screen members watch.
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        # On-demand component checks (the on-device model manifest) ignore the switch above; an
        # update source that is not a network address ends them before they reach the relay.
        "--component-updater=url-source=about:blank",
        "--disable-sync",
        "--gcm-checkin-url=about:blank",
        "--gcm-mcs-endpoint=about:blank",
        "--gcm-registration-url=about:blank",
        "--allow-browser-signin=false",
        "--disable-client-side-phishing-detection",
        "--gaia-url=http://0.0.0.0:1",
        "--disable-breakpad",
        "--disable-crash-reporter",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-background-timer-throttling",
        "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,"
        "CertificateTransparencyComponentUpdater,InterestFeedContentSuggestions,SafeBrowsing,"
        "NetworkTimeServiceQuerying,PushMessaging,DiceWebSigninInterception,"
        "SignInProfileCreation,Signin,GCMUseDedicatedNetworkThread,SharingService,"
        "SendTabToSelf,ClickToCall,AccountConsistency,MirrorAccountConsistency,"
        "ChromeWhatsNewUI,DeviceInfoSync,PushNotifications,LensStandalone,"
        "SyncInvalidations,FCMInvalidations,UseFCMInvalidations,PolicyInvalidations,"
        "SegmentationPlatform,OptimizationGuideModelDownloading,OptimizationGuideOnDeviceModel",
        "--safebrowsing-disable-auto-update",
        "--metrics-recording-only",
        "--no-pings",
        "--password-store=basic",
        "--use-mock-keychain",
        "--block-new-web-contents",
        "--proxy-server=" + PARAMS["proxy"],
        "--proxy-bypass-list=<-loopback>",
        "--window-position=0,0",
        "--window-size=%d,%d" % (width, height),
        # Maximized, the window follows the screen's mode as the member's pane changes it.
        "--start-maximized",
        "--force-device-scale-factor=1",
        "about:blank",
    ]
    spawn([PROGRAMS["chromium"]] + flags, env, pass_fds=(3, 4), preexec=fds)
    os.close(to_browser_r)
    os.close(from_browser_w)
    cdp = Cdp(to_browser_w, from_browser_r)
    targets = cdp.send("Target.getTargets", session=False, timeout=30)
    pages = [t for t in targets.get("targetInfos", []) if t.get("type") == "page"]
    deadline = time.monotonic() + 30
    while not pages and time.monotonic() < deadline:
        time.sleep(0.01)
        targets = cdp.send("Target.getTargets", session=False)
        pages = [t for t in targets.get("targetInfos", []) if t.get("type") == "page"]
    if not pages:
        raise Failure("runtime_start_failed", "the browser opened no page")
    PHASES["chromium"] = time.monotonic()
    attached = cdp.send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True}, session=False)
    cdp.session = attached["sessionId"]
    cdp.page = pages[0]["targetId"]
    # Every other page a page opens is closed after each action: one page per session.
    commands = [
        ("Target.setDiscoverTargets", {"discover": True}, False),
        ("Page.enable", None, True),
        ("Network.enable", None, True),
        ("Runtime.enable", None, True),
        ("Page.setLifecycleEventsEnabled", {"enabled": True}, True),
    ]
    # The open's first navigation goes in the same batch, after the domains it is watched by:
    # the page loads while the rest of the setup is answered.
    url = PARAMS.get("url")
    if url:
        cdp.events.clear()
        cdp.document = None
        commands.append(("Page.navigate", {"url": url}, True))
        PHASES["navigation_sent"] = time.monotonic()
    results = cdp.send_all(commands, tolerate=True)
    for result in results[:5]:
        if "__error__" in result:
            raise Failure("browser_error", result["__error__"])
    return cdp, (results[5] if url else None)


def bounded(text, limit):
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def evaluate(cdp, expression, seconds=None):
    seconds = seconds or PARAMS["step_seconds"]
    started = time.monotonic()
    try:
        result = cdp.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True,
            "timeout": int(seconds * 1000), "userGesture": False,
        }, timeout=seconds + 1)
    except Failure as failure:
        # The renderer terminates an evaluation at its timeout and says only "Internal error".
        if failure.code == "browser_error" and time.monotonic() - started >= seconds * 0.9:
            raise Failure("action_timed_out", "the expression did not finish in time") from None
        raise
    if "exceptionDetails" in result:
        details = result["exceptionDetails"]
        text = details.get("exception", {}).get("description") or details.get("text", "")
        if "Execution was terminated" in text or "timeout" in text.lower():
            raise Failure("action_timed_out", "the expression did not finish in time")
        raise Failure("script_error", str(text)[:500])
    return result.get("result", {}).get("value")


def element_center(cdp, selector):
    found = evaluate(cdp, "(() => { const e = document.querySelector(%s); if (!e) return null;"
                          " e.scrollIntoView({block: 'center', inline: 'center'});"
                          " const r = e.getBoundingClientRect();"
                          " return [r.left + r.width / 2, r.top + r.height / 2, r.width, r.height]; })()"
                     % json.dumps(selector))
    if not found:
        raise Failure("selector_not_found", "no element matches " + selector[:200])
    if found[2] <= 0 or found[3] <= 0:
        raise Failure("selector_not_visible", "the element " + selector[:200] + " has no size")
    return found[0], found[1]


def click_at(cdp, x, y):
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        cdp.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})


KEYS = {
    "Enter": ("\r", 13), "Tab": ("\t", 9), "Backspace": ("", 8), "Escape": ("", 27),
    "ArrowDown": ("", 40), "ArrowUp": ("", 38), "ArrowLeft": ("", 37), "ArrowRight": ("", 39),
    "PageDown": ("", 34), "PageUp": ("", 33), "Home": ("", 36), "End": ("", 35), "Delete": ("", 46),
}


def wait_load(cdp, state, seconds):
    names = {"load": ("Page.loadEventFired",), "domcontentloaded": ("Page.domContentEventFired", "Page.loadEventFired")}
    if state not in names:
        raise Failure("action_invalid", "a load state is load or domcontentloaded")
    ready = evaluate(cdp, "document.readyState")
    if ready == "complete" or (state == "domcontentloaded" and ready == "interactive"):
        return
    if cdp.wait_event(names[state], seconds) is None:
        raise Failure("action_timed_out", "the page did not reach " + state + " in time")


def finish_navigation(cdp, result, seconds):
    """The navigation whose Page.navigate answered `result`, once its page has loaded."""
    if "__error__" in result:
        raise Failure("navigation_failed", result["__error__"])
    if result.get("errorText"):
        raise Failure("navigation_failed", result["errorText"])
    # The load of this navigation's document: its loader's lifecycle "load" (Page.loadEventFired
    # is not sent for a navigation that commits while the Page domain is being enabled). A
    # navigation within the same document has no loader and nothing to wait for.
    loader = result.get("loaderId")
    if loader is not None and cdp.wait_until(
            lambda e: e.get("method") == "Page.lifecycleEvent"
            and e.get("params", {}).get("name") == "load"
            and e.get("params", {}).get("loaderId") == loader, seconds) is None:
        raise Failure("action_timed_out", "the page did not load in time")
    response = cdp.document or {}
    headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
    if "x-corral-egress-reason" in headers:
        raise Failure("navigation_failed", "the egress proxy refused it: %s (HTTP %s)"
                      % (headers["x-corral-egress-reason"], response.get("status")))
    return {"url": evaluate(cdp, "location.href"), "title": evaluate(cdp, "document.title"),
            "status": response.get("status")}


def act(cdp, request):
    action = request.get("action")
    limit = PARAMS["reply_max_bytes"]
    seconds = min(float(request.get("timeout_ms", PARAMS["step_seconds"] * 1000)) / 1000, PARAMS["step_seconds"])
    if action == "navigate":
        cdp.events.clear()
        cdp.document = None
        result = cdp.send("Page.navigate", {"url": request["url"]}, timeout=seconds)
        return finish_navigation(cdp, result, seconds)
    if action == "click":
        x, y = element_center(cdp, request["selector"])
        click_at(cdp, x, y)
        return {"clicked": request["selector"]}
    if action == "type":
        if request.get("selector"):
            x, y = element_center(cdp, request["selector"])
            click_at(cdp, x, y)
            # The click focuses the field as a member's would; a page still settling may not
            # have taken it yet, so the field is given focus before a single key is sent.
            focused = evaluate(cdp, "(() => { const e = document.querySelector(%s);"
                                    " if (e && document.activeElement !== e) e.focus();"
                                    " return document.activeElement === e; })()"
                               % json.dumps(request["selector"]))
            if not focused:
                raise Failure("selector_not_focusable", "the element " + request["selector"][:200]
                              + " does not take the keyboard")
        cdp.send("Input.insertText", {"text": request["text"]})
        return {"typed": len(request["text"])}
    if action == "press":
        key = request["key"]
        text, code = KEYS.get(key, (key if len(key) == 1 else "", 0))
        if not text and not code:
            raise Failure("action_invalid", "an unknown key " + key[:40])
        cdp.send("Input.dispatchKeyEvent", {"type": "keyDown", "key": key, "text": text,
                                            "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code})
        cdp.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "windowsVirtualKeyCode": code,
                                            "nativeVirtualKeyCode": code})
        return {"pressed": key}
    if action == "scroll":
        cdp.send("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": PARAMS["width"] / 2,
                                              "y": PARAMS["height"] / 2,
                                              "deltaX": request.get("dx", 0), "deltaY": request.get("dy", 0)})
        return {"scrolled": [request.get("dx", 0), request.get("dy", 0)]}
    if action == "text":
        text, truncated = bounded(evaluate(cdp, "document.body ? document.body.innerText : ''") or "", limit)
        return {"text": text, "truncated": truncated}
    if action == "accessibility":
        tree = cdp.send("Accessibility.getFullAXTree", timeout=seconds)
        nodes = []
        size = 0
        for node in tree.get("nodes", []):
            if node.get("ignored"):
                continue
            role = node.get("role", {}).get("value", "")
            name = node.get("name", {}).get("value", "")
            if not name and role in ("generic", "none", "InlineTextBox"):
                continue
            entry = {"role": role, "name": str(name)[:300]}
            size += len(json.dumps(entry))
            if size > limit:
                return {"nodes": nodes, "truncated": True}
            nodes.append(entry)
        return {"nodes": nodes, "truncated": False}
    if action == "evaluate":
        value = evaluate(cdp, request["expression"], seconds)
        text, truncated = bounded(json.dumps(value), limit)
        return {"value": text, "truncated": truncated}
    if action == "screenshot":
        shot = cdp.send("Page.captureScreenshot", {"format": "png"}, timeout=seconds)
        data = shot.get("data", "")
        if len(data) > limit * 4:
            raise Failure("reply_too_large", "the screenshot is over the reply bound")
        return {"png": data}
    if action == "wait":
        wait_load(cdp, request.get("state", "load"), seconds)
        return {"state": request.get("state", "load")}
    raise Failure("action_invalid", "an unknown action")


def close_popups(cdp):
    """Closes every page target but the session's own that the browser announced."""
    kept = []
    extra = []
    for event in cdp.events:
        info = event.get("params", {}).get("targetInfo", {})
        if event.get("method") == "Target.targetCreated" and info.get("type") == "page" \
                and info.get("targetId") != cdp.page:
            extra.append(info["targetId"])
        else:
            kept.append(event)
    cdp.events = kept
    for target in extra:
        try:
            cdp.send("Target.closeTarget", {"targetId": target}, session=False)
        except Failure:
            pass
    return len(extra)


def stop(*_):
    for child in reversed(CHILDREN):
        try:
            child.terminate()
        except Exception:
            pass
    deadline = time.monotonic() + 3
    for child in CHILDREN:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except Exception:
            child.kill()
    sys.exit(0)


def main():
    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    try:
        cdp, sent = start()
    except Failure as failure:
        say({"ready": False, "error": {"code": failure.code, "message": failure.message}})
        stop()
    PHASES["attached"] = time.monotonic()
    ready = {"ready": True}
    if sent is not None:
        try:
            ready["navigated"] = {"ok": finish_navigation(cdp, sent, PARAMS["step_seconds"])}
        except Failure as failure:
            ready["navigated"] = {"error": {"code": failure.code, "message": failure.message}}
        close_popups(cdp)
        ready["navigated"]["took_ms"] = int((time.monotonic() - PHASES["navigation_sent"]) * 1000)
        PHASES["navigated"] = time.monotonic()
    ready["start_ms"] = int((time.monotonic() - started) * 1000)
    ready["phases"] = {k: int((v - started) * 1000) for k, v in PHASES.items()}
    say(ready)
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            say({"id": None, "error": {"code": "action_invalid", "message": "not JSON"}})
            continue
        if request.get("action") == "close":
            say({"id": request.get("id"), "ok": {"closing": True}})
            stop()
        try:
            result = act(cdp, request)
            close_popups(cdp)
            say({"id": request.get("id"), "ok": result})
        except Failure as failure:
            say({"id": request.get("id"), "error": {"code": failure.code, "message": failure.message}})
        except KeyError as missing:
            say({"id": request.get("id"), "error": {"code": "action_invalid", "message": "missing " + str(missing)}})
    stop()


main()
