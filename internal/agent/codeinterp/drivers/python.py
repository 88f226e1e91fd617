# cella code-interpreter driver for Python: one long-lived interpreter per
# context. The agent sends one JSON command per line on fd 3 and reads JSON
# events from fd 4; the cell's own stdout/stderr are fds 1 and 2, which the
# agent streams live. After each cell the driver writes a marker to fds 1 and
# 2 so that the agent knows it has every byte the cell printed before it
# reports the end of the execution.
import ast, base64, builtins, json, linecache, os, signal, sys, traceback, types, warnings

_MARK = b"\x00cella-cell-end-" + os.environ.pop("CELLA_CI_MARK", "").encode() + b"\x00"
_cmd = os.fdopen(3, "rb", buffering=0)
_evt = os.fdopen(4, "wb", buffering=0)
_executing = False
_count = 0

# Line-buffered streams: a print reaches the agent at once, as one chunk.
sys.stdout.reconfigure(line_buffering=True, errors="backslashreplace")
sys.stderr.reconfigure(line_buffering=True, errors="backslashreplace")


def _emit(obj):
    _evt.write(json.dumps(obj, default=str).encode() + b"\n")


def _on_sigint(signum, frame):
    # Only a running cell is interrupted; a SIGINT that races with the end of
    # a cell must not break the driver's own loop.
    if _executing:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)

# matplotlib draws into memory; figures are shown as PNG results.
os.environ.setdefault("MPLBACKEND", "Agg")
warnings.filterwarnings("ignore", message=".*(non-interactive|non-GUI backend).*")

_REPRS = [
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"), ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"), ("application/pdf", "_repr_pdf_"),
    ("text/latex", "_repr_latex_"), ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
]


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _bundle(obj):
    """The MIME bundle of obj, following IPython's display protocol."""
    data = {}
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is not None and isinstance(obj, mpl.Figure):
        data["image/png"] = _figure_png(obj)
    m = getattr(obj, "_repr_mimebundle_", None)
    if callable(m) and not isinstance(obj, type):
        try:
            b = m()
            if isinstance(b, tuple):
                b = b[0]
            if isinstance(b, dict):
                data.update(b)
        except Exception:
            pass
    if not isinstance(obj, type):
        for mime, name in _REPRS:
            if mime in data:
                continue
            f = getattr(obj, name, None)
            if not callable(f):
                continue
            try:
                v = f()
            except Exception:
                continue
            if isinstance(v, tuple):
                v = v[0]
            if v is None:
                continue
            if isinstance(v, bytes):
                v = base64.b64encode(v).decode()
            data[mime] = v
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<repr failed: %s>" % e
    return data


def _result(obj, main):
    sys.stdout.flush()
    sys.stderr.flush()
    _emit({"type": "result", "main": main, "data": _bundle(obj)})


def display(*objs, **kwargs):
    """IPython's display(): each object becomes a (non-main) result."""
    for o in objs:
        if kwargs.get("raw") and isinstance(o, dict):
            sys.stdout.flush()
            _emit({"type": "result", "main": False, "data": o})
        else:
            _result(o, False)


def _show_figures(*args, **kwargs):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        _emit({"type": "result", "main": False,
               "data": {"image/png": _figure_png(fig), "text/plain": repr(fig)}})
    plt.close("all")


def _patch_pyplot():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and getattr(plt.show, "__module__", "") != __name__:
        plt.show = _show_figures


# The cells' globals are a fresh __main__ module (pickle and dataclasses look
# classes up there), separate from the driver's own globals.
_main_mod = types.ModuleType("__main__")
_main_mod.__dict__.update({"__builtins__": builtins, "display": display})
sys.modules["__main__"] = _main_mod
_ns = _main_mod.__dict__


def _compile(src, filename):
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    tree = compile(src, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", flags, dont_inherit=True)
    expr = compile(last, filename, "eval", flags, dont_inherit=True) if last is not None else None
    return body, expr


def _run(code):
    v = eval(code, _ns)
    if code.co_flags & 0x80:  # CO_COROUTINE: top-level await
        import asyncio
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
        v = loop.run_until_complete(v)
    return v


def _user_tb(e, filename):
    """The traceback without the driver's own frames."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    return tb


def _execute(cmd):
    global _executing, _count
    _count += 1
    filename = "<cell-%d>" % _count
    src = cmd.get("code", "")
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    saved = {}
    for k, v in (cmd.get("env_vars") or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = str(v)
    try:
        _executing = True
        body, expr = _compile(src, filename)
        _run(body)
        value = _run(expr) if expr is not None else None
        _executing = False
        _patch_pyplot()
        _show_figures()
        if value is not None:
            builtins._ = value
            _result(value, True)
    except BaseException as e:  # KeyboardInterrupt and SystemExit included, as in Jupyter
        _executing = False
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            _patch_pyplot()
            _show_figures()
        except BaseException:
            pass
        if isinstance(e, SyntaxError):
            tb = "".join(traceback.format_exception_only(type(e), e))
        else:
            tb = "".join(traceback.format_exception(type(e), e, _user_tb(e, filename)))
        value = str(e)
        if isinstance(e, SyntaxError):
            value = e.msg or str(e)
        _emit({"type": "error", "name": type(e).__name__, "value": value, "traceback": tb})
    finally:
        _executing = False
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _mark():
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os.write(1, _MARK)
    os.write(2, _MARK)


def _main():
    _emit({"type": "ready", "pid": os.getpid()})
    buf = b""
    while True:
        try:
            chunk = _cmd.readline()
        except KeyboardInterrupt:
            continue
        if not chunk:
            return
        buf += chunk
        if not buf.endswith(b"\n"):
            continue
        line, buf = buf, b""
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if cmd.get("type") == "execute":
            try:
                _execute(cmd)
            except KeyboardInterrupt:
                _emit({"type": "error", "name": "KeyboardInterrupt", "value": "", "traceback": "KeyboardInterrupt\n"})
            # No SIGINT can interrupt this: the handler only raises while a
            # cell runs.
            _mark()
            _emit({"type": "done"})


_main()
