def _corral_results(value, has_value, path, limits):
    # Rich results (issue 31, corral_core::run::results): the value of the last expression and the
    # Matplotlib figures left open, each as its representations, one JSON line each in `path`,
    # within `limits` (results, text characters, HTML bytes, PNG bytes). The first writer wins: a
    # persistent cell's driver writes before the bootstrap that runs it. Nothing here may change
    # how the run ends.
    import sys
    try:
        import os
        if os.path.lexists(path):
            return
        most, text_max, html_max, png_max = limits
        out = []
        shown = set()
        figure_module = sys.modules.get('matplotlib.figure')

        def png_of(figure):
            import io, base64
            buffer = io.BytesIO()
            figure.savefig(buffer, format='png')
            data = buffer.getvalue()
            return base64.b64encode(data).decode() if len(data) <= png_max else None

        def reprs(v):
            r = {}
            try:
                r['text/plain'] = repr(v)[:text_max + 1]  # one over: the judge marks the cut
            except Exception:
                pass
            if figure_module is not None and isinstance(v, figure_module.Figure):
                shown.add(id(v))
                data = png_of(v)
                if data:
                    r['image/png'] = data
                return r
            try:
                html = getattr(v, '_repr_html_', None)
                html = html() if callable(html) else None
                if isinstance(html, str) and len(html.encode()) <= html_max:
                    r['text/html'] = html
            except Exception:
                pass
            try:
                png = getattr(v, '_repr_png_', None)
                png = png() if callable(png) else None
                if isinstance(png, bytes) and len(png) <= png_max:
                    import base64
                    r['image/png'] = base64.b64encode(png).decode()
            except Exception:
                pass
            return r

        if has_value and value is not None:
            out.append(reprs(value))
        pyplot = sys.modules.get('matplotlib.pyplot')
        if pyplot is not None:
            for number in pyplot.get_fignums():
                figure = pyplot.figure(number)
                if id(figure) in shown or len(out) >= most:
                    continue
                data = png_of(figure)
                if data:
                    out.append({'text/plain': repr(figure)[:text_max + 1], 'image/png': data})
        out = [r for r in out[:most] if r]
        if out:
            import json
            with open(path, 'w') as f:
                for r in out:
                    f.write(json.dumps(r) + '\n')
    except BaseException:
        pass
