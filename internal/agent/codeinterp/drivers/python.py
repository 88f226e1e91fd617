# cella code-interpreter driver for Python: IPython's own InteractiveShell,
# one long-lived shell per context, so cells behave as in E2B's Jupyter
# kernels (which are IPython too): indented cells are dedented, `!cmd` and
# %magics work, IPython.display and display() work, and the formats of a
# result come from IPython's display formatter.
#
# The agent sends one JSON command per line on fd 3 and reads JSON events
# from fd 4; the cell's own stdout/stderr are fds 1 and 2, which the agent
# streams live (a `!cmd` writes to them directly). After each cell the
# driver writes a marker to fds 1 and 2 so that the agent knows it has every
# byte the cell printed before it reports the end of the execution.
import base64, json, math, os, signal, sys

_MARK = b"\x00cella-cell-end-" + os.environ.pop("CELLA_CI_MARK", "").encode() + b"\x00"
_cmd = os.fdopen(3, "rb", buffering=0)
_evt = os.fdopen(4, "wb", buffering=0)
_executing = False

# Line-buffered streams: a print reaches the agent at once, as one chunk.
sys.stdout.reconfigure(line_buffering=True, errors="backslashreplace")
sys.stderr.reconfigure(line_buffering=True, errors="backslashreplace")

# matplotlib's inline backend, as ipykernel sets it: figures a cell draws are
# displayed (PNG, their repr and the e2b/chart formatter) when it ends.
os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
# A kernel has no terminal: no colours in tracebacks or in !cmd output.
os.environ.setdefault("TERM", "dumb")


def _plain(v):
    """v with NaN and infinities as None: JSON has neither."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _default(o):
    item = getattr(o, "item", None)  # numpy scalars
    if callable(item):
        try:
            return _plain(item())
        except Exception:
            pass
    tolist = getattr(o, "tolist", None)  # numpy arrays
    if callable(tolist):
        try:
            return _plain(tolist())
        except Exception:
            pass
    iso = getattr(o, "isoformat", None)  # dates, pandas Timestamps
    if callable(iso):
        return iso()
    return str(o)


def _emit(obj):
    _evt.write(json.dumps(_plain(obj), default=_default, allow_nan=False).encode() + b"\n")


def _emit_result(data, main):
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    # Binary formats (a PIL image's PNG) travel as base64, as Jupyter's
    # messages carry them.
    data = {k: base64.b64encode(v).decode() if isinstance(v, (bytes, bytearray)) else v
            for k, v in (data or {}).items() if v is not None}
    try:
        _emit({"type": "result", "main": main, "data": data})
    except (TypeError, ValueError) as e:
        _emit({"type": "result", "main": main, "data": {"text/plain": data.get("text/plain", repr(e))}})


def _on_sigint(signum, frame):
    # Only a running cell is interrupted; a SIGINT that races with the end of
    # a cell must not break the driver's own loop.
    if _executing:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)

from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.formatters import BaseFormatter, JSONFormatter
from IPython.core.interactiveshell import InteractiveShell
from traitlets import ObjectName, Unicode


class _DisplayHook(DisplayHook):
    """The value of a cell's last expression: E2B's main result."""

    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        _emit_result(format_dict, True)

    def finish_displayhook(self):
        pass


class _DisplayPublisher(DisplayPublisher):
    """display() and the figures of the inline backend: other results."""

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        _emit_result(data, False)

    def clear_output(self, wait=False):
        pass


class _DataFormatter(BaseFormatter):
    """E2B's e2b/data: a DataFrame as {column: [values]}."""

    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
        if pd is None or not isinstance(obj, pd.DataFrame):
            return super().__call__(obj)
        out = obj.to_dict(orient="list")
        return {str(k): [x.isoformat() if isinstance(x, pd.Timestamp) else x for x in v] for k, v in out.items()}


class _ChartFormatter(BaseFormatter):
    """E2B's e2b/chart: what a matplotlib figure shows, as data."""

    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj):
        if "matplotlib" not in sys.modules:
            return super().__call__(obj)
        from matplotlib.figure import Figure

        if not isinstance(obj, Figure):
            return super().__call__(obj)
        try:
            return _figure_chart(obj)  # drivers/charts.py
        except Exception:
            return None


class _JSONFormatter(JSONFormatter):
    """As E2B's: lists and dicts are JSON results too."""

    def __call__(self, obj):
        if isinstance(obj, (list, dict)):
            try:
                return json.loads(json.dumps(_plain(obj), default=_default, allow_nan=False)), {"expanded": True}
            except (TypeError, ValueError):
                pass
        return super().__call__(obj)


class _Shell(InteractiveShell):
    def _showtraceback(self, etype, evalue, stb):
        # What ipykernel sends as its error message; E2B's ExecutionError.
        _emit({"type": "error", "name": getattr(etype, "__name__", str(etype)), "value": str(evalue),
               "traceback": self.InteractiveTB.stb2text(stb)})

    # `!cmd` runs with the cell's own fds: its output streams live, stdout
    # and stderr apart, as a Jupyter kernel's does.
    system = InteractiveShell.system_raw

    def enable_gui(self, gui=None):
        pass


from traitlets.config import Config as _Config

_config = _Config()
# No history database (and no thread saving to it): nothing reads it back.
_config.HistoryManager.enabled = False
shell = _Shell.instance(
    config=_config,
    displayhook_class=_DisplayHook,
    display_pub_class=_DisplayPublisher,
    colors="NoColor",
)
_formatters = shell.display_formatter.formatters
_formatters["e2b/data"] = _DataFormatter(parent=shell.display_formatter)
_formatters["e2b/chart"] = _ChartFormatter(parent=shell.display_formatter)
_formatters["application/json"] = _JSONFormatter(parent=shell.display_formatter)
# display() as a builtin, as in a kernel's namespace.
from IPython.display import display as _display

shell.user_ns.setdefault("display", _display)

# As E2B's kernels: an image saved to a file is displayed too, and no image
# viewer is ever started (show() displays through IPython, as PIL does
# under IPython).
try:
    from PIL import Image as _PILImage, ImageShow as _PILImageShow

    _PILImageShow.UnixViewer.show_file = lambda self, path, **options: 0
    _pil_save = _PILImage.Image.save

    def _save_and_display(image, fp, format=None, **params):
        if isinstance(fp, str):
            _display(image)
        return _pil_save(image, fp, format, **params)

    _PILImage.Image.save = _save_and_display
except ImportError:
    pass


def _execute(cmd):
    global _executing
    os.environ.update(cmd.get("env_base") or {})  # the sandbox's env vars, for good
    saved = {}
    for k, v in (cmd.get("env_vars") or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = str(v)
    try:
        _executing = True
        shell.run_cell(cmd.get("code", ""), store_history=True)
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
