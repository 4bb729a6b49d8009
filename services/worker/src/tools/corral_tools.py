"""Read-only tools the platform gave this run (KER-5).

    import corral_tools
    corral_tools.available()                    # the tools this run may call
    corral_tools.call('docs.search', query='q') # the tool's bounded answer

The worker's supervisor holds the capability and forwards each call; this module never sees it.
A refused or failed call raises ToolError with a stable code (tool_not_granted,
tool_write_refused, tool_recursive_refused, tool_payload_too_large, tool_unavailable, ...).
"""
import http.client
import json

PORT = 8099


class ToolError(Exception):
    def __init__(self, code, message):
        super().__init__('%s: %s' % (code, message))
        self.code = code


def _request(method, path, body=None):
    connection = http.client.HTTPConnection('127.0.0.1', PORT, timeout=60)
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, body=payload,
                           headers={'Content-Type': 'application/json'})
        response = connection.getresponse()
        data = response.read()
    except OSError as e:
        raise ToolError('tool_unavailable', 'this run was given no tools (%s)' % e) from None
    finally:
        connection.close()
    reply = json.loads(data or b'null')
    if response.status != 200:
        error = (reply or {}).get('error') or {}
        raise ToolError(error.get('code', 'tool_failed'), error.get('message', ''))
    return reply


def available():
    """The names of the tools this run may call."""
    return _request('GET', '/tools')['tools']


def call(tool, **arguments):
    """Calls `tool` with `arguments`; its answer."""
    return _request('POST', '/call', {'tool': tool, 'arguments': arguments})['result']
