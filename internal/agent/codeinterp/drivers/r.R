# cella code-interpreter driver for R: one long-lived R per context. Cells
# are evaluated as IRkernel evaluates them, with the evaluate package, in
# the global environment; values are shown through the repr package
# (text/plain as R prints them, text/html, text/markdown, text/latex) and
# plots become PNG results. Protocol as in the Python driver: JSON commands
# on fd 3, JSON events on fd 4, the cell's output on fds 1 and 2 (one chunk
# per top-level expression, as in IRkernel) followed by a marker.
local({
  nonce <- Sys.getenv("CELLA_CI_MARK")
  Sys.unsetenv("CELLA_CI_MARK")
  # R opens files by name only, and /dev/fd/N of the agent's pipes is not
  # the sandbox user's to open: a cat that inherited the fd carries each.
  cmd <- pipe("exec cat <&3", open = "rb")
  evt <- pipe("exec cat >&4", open = "wb")
  out <- list(stdout = pipe("exec cat", open = "wb"), stderr = pipe("exec cat >&2", open = "wb"))
  emit <- function(x) {
    writeLines(jsonlite::toJSON(x, auto_unbox = TRUE, null = "null", na = "null", digits = NA), evt, useBytes = TRUE)
    flush(evt)
  }
  write_stream <- function(name, text) {
    if (length(text) && nzchar(paste(text, collapse = ""))) {
      writeBin(charToRaw(enc2utf8(paste(text, collapse = ""))), out[[name]])
      flush(out[[name]])
    }
  }
  mimes <- c("text/plain", "text/html", "text/markdown", "text/latex")
  bundle <- function(v) {
    data <- list()
    for (m in mimes) {
      r <- tryCatch(repr::mime2repr[[m]](v), error = function(e) NULL)
      if (!is.null(r) && length(r)) data[[m]] <- paste(r, collapse = "\n")
    }
    data
  }
  plot_png <- function(p) {
    f <- tempfile(fileext = ".png")
    on.exit(unlink(f))
    grDevices::png(f, width = 7, height = 7, units = "in", res = 72, type = "cairo")
    tryCatch(grDevices::replayPlot(p), finally = grDevices::dev.off())
    jsonlite::base64_enc(readBin(f, "raw", file.info(f)$size))
  }
  handler <- evaluate::new_output_handler(
    text = function(o) write_stream("stdout", o),
    graphics = function(p) {
      emit(list(type = "result", main = FALSE, data = list("image/png" = plot_png(p), "text/plain" = "plot without title")))
    },
    message = function(m) write_stream("stderr", conditionMessage(m)),
    warning = function(w) write_stream("stderr", paste0("Warning message:\n", conditionMessage(w), "\n")),
    error = function(e) {
      calls <- if (!is.null(conditionCall(e))) paste0("Error in ", deparse(conditionCall(e))[1], ": ") else "Error: "
      emit(list(type = "error", name = "ERROR", value = conditionMessage(e), traceback = paste0(calls, conditionMessage(e), "\n")))
    },
    value = function(v, visible = TRUE) {
      if (visible) emit(list(type = "result", main = TRUE, data = bundle(v)))
    }
  )
  # Plots are recorded on a device of their own and replayed into PNGs.
  grDevices::pdf(NULL)
  grDevices::dev.control("enable")
  emit(list(type = "ready", pid = Sys.getpid()))
  repeat {
    line <- tryCatch(readLines(cmd, n = 1, warn = FALSE, encoding = "UTF-8"), interrupt = function(e) character())
    if (!length(line)) {
      if (isIncomplete(cmd)) next
      break
    }
    c <- tryCatch(jsonlite::fromJSON(line, simplifyVector = FALSE), error = function(e) NULL)
    if (is.null(c) || !identical(c$type, "execute")) next
    saved <- list()
    for (k in names(c$env_vars)) {
      saved[[k]] <- Sys.getenv(k, unset = NA)
      do.call(Sys.setenv, stats::setNames(list(as.character(c$env_vars[[k]])), k))
    }
    tryCatch(
      evaluate::evaluate(if (is.null(c$code)) "" else c$code, envir = globalenv(), stop_on_error = 1L,
                         new_device = FALSE, output_handler = handler),
      interrupt = function(e) emit(list(type = "error", name = "KeyboardInterrupt", value = "", traceback = "KeyboardInterrupt\n")),
      error = function(e) emit(list(type = "error", name = "ERROR", value = conditionMessage(e), traceback = ""))
    )
    for (k in names(saved)) {
      if (is.na(saved[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, stats::setNames(list(saved[[k]]), k))
    }
    mark <- c(as.raw(0), charToRaw(paste0("cella-cell-end-", nonce)), as.raw(0))
    writeBin(mark, out$stdout); flush(out$stdout)
    writeBin(mark, out$stderr); flush(out$stderr)
    emit(list(type = "done"))
  }
})
