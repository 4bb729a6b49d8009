# A member's browser for the live-view tests: headless Chromium (Debian's) driven over an
# inherited DevTools pipe, no debugger socket. It loads one URL and then answers one JSON line per
# command on stdin, one JSON line on stdout:
#   {"eval": "<expression>"}            -> {"ok": <value>}    (awaits a promise)
#   {"screenshot": true}                -> {"ok": "<base64 png>"}
#   {"click": [x, y]}                   -> {"ok": true}       (a real mouse click in the page)
#   {"navigate": "<url>"}               -> {"ok": true}
#   {"metrics": [w, h, ratio]}          -> {"ok": true}       (the window's CSS size and pixel ratio)
#   {"cookies": true}                   -> {"ok": [<cookie>, ...]} (the browser's whole cookie store)
# Standard library only.
import ctypes
import fcntl
import json
import os
import select
import subprocess
import sys
import tempfile
import time

CHROMIUM = "/usr/lib/chromium/chromium"


class Cdp:
    def __init__(self, w, r):
        self.w, self.r, self.buf, self.next_id, self.session = w, r, b"", 0, None

    def send(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self.w, data):]
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buf:
                line, self.buf = self.buf.split(b"\0", 1)
                reply = json.loads(line)
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError(json.dumps(reply["error"]))
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(method + " timed out")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium ended")
                self.buf += chunk


def main():
    url = sys.argv[1]
    width, height = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "800x500").split("x"))
    profile = tempfile.mkdtemp(prefix="corral-viewer-")
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()

    def fds():
        # Chromium dies with this driver, however it ends (PR_SET_PDEATHSIG, SIGKILL).
        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)
        r = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
        w = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
        os.dup2(r, 3)
        os.dup2(w, 4)

    child = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
         "--user-data-dir=" + profile, "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--autoplay-policy=no-user-gesture-required", "--window-size=%d,%d" % (width, height),
         "--force-device-scale-factor=1", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        pass_fds=(3, 4), preexec_fn=fds, close_fds=True)
    os.close(to_r)
    os.close(from_w)
    cdp = Cdp(to_w, from_r)
    try:
        pages = []
        deadline = time.monotonic() + 30
        while not pages and time.monotonic() < deadline:
            targets = cdp.send("Target.getTargets", session=False)
            pages = [t for t in targets["targetInfos"] if t["type"] == "page"]
            if not pages:
                time.sleep(0.05)
        attached = cdp.send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True}, session=False)
        cdp.session = attached["sessionId"]
        cdp.send("Page.enable")
        cdp.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        cdp.send("Page.navigate", {"url": url})
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            try:
                if "eval" in command:
                    result = cdp.send("Runtime.evaluate", {"expression": command["eval"], "awaitPromise": True, "returnByValue": True})
                    if "exceptionDetails" in result:
                        answer = {"error": json.dumps(result["exceptionDetails"])[:2000]}
                    else:
                        answer = {"ok": result["result"].get("value")}
                elif "cookies" in command:
                    answer = {"ok": cdp.send("Storage.getCookies", session=False)["cookies"]}
                elif "screenshot" in command:
                    answer = {"ok": cdp.send("Page.captureScreenshot", {"format": "png"})["data"]}
                elif "navigate" in command:
                    cdp.send("Page.navigate", {"url": command["navigate"]})
                    answer = {"ok": True}
                elif "metrics" in command:
                    w, h, ratio = command["metrics"]
                    cdp.send("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": ratio, "mobile": False})
                    answer = {"ok": True}
                elif "click" in command:
                    x, y = command["click"]
                    for kind in ("mousePressed", "mouseReleased"):
                        cdp.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
                    answer = {"ok": True}
                else:
                    answer = {"error": "unknown command"}
            except RuntimeError as e:
                answer = {"error": str(e)}
            print(json.dumps(answer), flush=True)
    finally:
        child.kill()
        child.wait()
        subprocess.run(["rm", "-rf", profile])


main()
