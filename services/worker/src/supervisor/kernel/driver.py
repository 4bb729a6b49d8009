def _corral_kernel(params, limits):
    # A persistent Python cell (KER-1 to KER-3, decision 0016): restore the previous cell's
    # variables, run the cell as the main program, checkpoint the variables. The supervisor has
    # already checked the checkpoint's structure, seal and runtime; this restores all of it or
    # nothing, and never runs the cell on a partial restore.
    import sys, os, io, json, base64, hashlib, linecache, pickle, traceback
    g = sys.modules['__main__'].__dict__
    g.pop('_corral_kernel', None)
    checkpoint = g.pop('_corral_checkpoint')
    results = g.pop('_corral_results')
    p = json.loads(base64.b64decode(params))
    src = p['cell']
    filename = p['filename']
    path = p['checkpoint']

    def fail(message):
        sys.stdout.flush()
        sys.stderr.write('corral kernel: ' + message + '\n')
        sys.stderr.flush()
        raise SystemExit(1)

    if os.path.exists(path):
        with open(path, 'rb') as f:
            data = f.read()
        first = data.index(b'\n')
        second = data.index(b'\n', first + 1)
        try:
            import cloudpickle  # noqa: F401  (functions and classes kept by value need it)
            state = pickle.loads(data[second + 1:])
        except BaseException as e:
            fail('the checkpoint could not be restored (%s: %s); nothing was restored and the '
                 'cell did not run' % (type(e).__name__, str(e)[:200]))
        if not isinstance(state, dict):
            fail('the checkpoint holds no variables; nothing was restored and the cell did not run')
        g.update(state)
        del state, data

    lines = src.splitlines(True)
    linecache.cache[filename] = (len(src), None, lines, filename)
    status = 0
    try:
        # The last statement, when it is an expression, is evaluated apart: its value is the
        # cell's rich result, as a notebook shows it.
        import _ast as ast
        tree = compile(src, filename, 'exec', ast.PyCF_ONLY_AST)
        last = tree.body.pop() if tree.body and type(tree.body[-1]) is ast.Expr else None
        code = compile(tree, filename, 'exec')
        last = compile(ast.Expression(last.value), filename, 'eval') if last is not None else None
        del tree
    except SyntaxError as e:
        traceback.print_exception(type(e), e, None)
        # Nothing ran: the checkpoint stays as it was.
        raise SystemExit(1)
    value = None
    try:
        exec(code, g)
        if last is not None:
            value = eval(last, g)
    except SystemExit as e:
        c = e.code
        if c is None:
            status = 0
        elif isinstance(c, int):
            status = c
        else:
            print(c, file=sys.stderr)
            status = 1
    except BaseException as e:
        tb = e.__traceback__
        if tb is not None:
            e.__traceback__ = tb = tb.tb_next
        # The Python printer, which reads the cell's lines from linecache; the interpreter's own
        # would read the driver's file.
        traceback.print_exception(type(e), e, tb)
        status = 1
    results(value, last is not None, p['results'], limits)
    value = None
    try:
        checkpoint(g, p)
    except OSError as e:
        # The workspace is full or unwritable: the previous checkpoint stays authoritative.
        sys.stderr.write('corral kernel: the checkpoint was not written (%s); the previous one '
                         'stays\n' % (e.strerror or e))
        status = status or 1
    raise SystemExit(status)


def _corral_checkpoint(g, p):
    import sys, os, io, json, errno, hashlib, pickle, types
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    limit = p['reason_max']

    class NotKept(Exception):
        pass

    def never(obj):
        # What is never checkpointed (KER-3): open handles, sockets, threads, processes, running
        # frames. Checked by type, before pickling could try.
        m = sys.modules
        if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)):
            return 'a file object' if getattr(obj, 'closed', False) else 'an open file'
        if 'socket' in m and isinstance(obj, m['socket'].socket):
            return 'a socket'
        if 'threading' in m and isinstance(obj, m['threading'].Thread):
            return 'a thread'
        if '_thread' in m and isinstance(obj, (m['_thread'].LockType, m['_thread'].RLock)):
            return 'a lock (thread state)'
        if 'subprocess' in m and isinstance(obj, m['subprocess'].Popen):
            return 'a process handle'
        if 'sqlite3' in m and isinstance(obj, (m['sqlite3'].Connection, m['sqlite3'].Cursor)):
            return 'a database connection'
        if 'mmap' in m and isinstance(obj, m['mmap'].mmap):
            return 'a memory map'
        if 'selectors' in m and isinstance(obj, m['selectors'].BaseSelector):
            return 'a selector (open handles)'
        if 'asyncio' in m and isinstance(obj, m['asyncio'].AbstractEventLoop):
            return 'an event loop'
        if isinstance(obj, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType,
                            types.FrameType, types.TracebackType)):
            return 'a running frame (generator, coroutine or traceback)'
        return None

    base = cloudpickle.CloudPickler if cloudpickle is not None else pickle.Pickler

    class Pickler(base):
        root = None

        def reducer_override(self, obj):
            why = never(obj)
            if why is not None:
                raise NotKept(why if obj is self.root else 'holds ' + why)
            parent = getattr(super(), 'reducer_override', None)
            return parent(obj) if parent is not None else NotImplemented

    def dumps(obj, root=None):
        buffer = io.BytesIO()
        pickler = Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.root = root
        pickler.dump(obj)
        data = buffer.getvalue()
        # What does not load back is not kept either.
        pickle.loads(data)
        return data

    def reason(e):
        if isinstance(e, NotKept):
            return str(e)
        return ('unpicklable: %s: %s' % (type(e).__name__, e))[:limit]

    names = [k for k in g if not (k.startswith('__') and k.endswith('__'))]
    kept = {k: g[k] for k in names}
    not_kept = []
    try:
        payload = dumps(kept)
    except BaseException:
        # One pickler over every value keeps shared references and cycles; the values that fail
        # are found one by one, reported by name, and the rest pickled together again.
        for k in names:
            try:
                dumps(kept[k], root=kept[k])
            except BaseException as e:
                not_kept.append({'name': k, 'reason': reason(e)})
                del kept[k]
        try:
            payload = dumps(kept)
        except BaseException as e:
            for k in kept:
                not_kept.append({'name': k, 'reason': 'not kept with the others: ' + reason(e)})
            kept = {}
            payload = dumps(kept)
    imports = set()
    for value in kept.values():
        for item in [value] + (list(value.values()) if isinstance(value, dict)
                               else list(value) if isinstance(value, (list, tuple)) else []):
            module = (item.__name__ if isinstance(item, types.ModuleType)
                      else getattr(type(item), '__module__', None))
            if isinstance(module, str):
                imports.add(module.split('.')[0])
    imports -= {'builtins', '__main__'}
    header = {
        'imports': sorted(imports)[:64],
        'language': 'python',
        'runtime': p['runtime'],
        'nonce': p['nonce'],
        'payload_bytes': len(payload),
        'payload_sha256': hashlib.sha256(payload).hexdigest(),
        'kept': list(kept),
        'not_kept': not_kept,
    }
    path = p['checkpoint']
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + '.tmp'
    try:
        with open(temporary, 'wb') as f:
            f.write(p['magic'].encode() + b'\n')
            f.write(json.dumps(header).encode() + b'\n')
            f.write(payload)
        os.replace(temporary, path)
    except OSError as e:
        # A full workspace is left full, so that the run reports SANDBOX_WORKSPACE_MAX_BYTES (and
        # its workspace is not kept); anything else leaves no partial file behind.
        if e.errno != errno.ENOSPC:
            try:
                os.unlink(temporary)
            except OSError:
                pass
        raise

