# cella code-interpreter driver for bash: one long-lived bash per context,
# so variables, functions and the working directory stay between cells, as
# in E2B's bash kernel. Each cell arrives on fd 3 as three NUL-terminated
# scripts (set the cell's env vars, the cell, restore them); events go to
# fd 4 as JSON lines; the cell's output is the shell's own fds 1 and 2,
# followed by a marker after each cell. A cell that ends with a non-zero
# status is an error whose value is the status, as bash_kernel reports it.
# The cell runs in a function, so `return` ends it; `exit` ends the shell
# (the next cell starts a new one, as after a kernel's death).
__cella_nonce=$CELLA_CI_MARK
unset CELLA_CI_MARK
# The interrupt (SIGINT to the process group: the foreground command gets
# it too) ends the cell, as ^C ends a command line in an interactive
# shell, and the shell with its state lives on: the handler returns from
# the function the cell runs in (or from the cell's own innermost one).
__cella_cell() { eval "$__cella_code" 3<&- 4>&-; }
trap 'return 130 2>/dev/null' INT
printf '{"type":"ready","pid":%d}\n' "$$" >&4
while IFS= read -r -d '' __cella_set <&3 && IFS= read -r -d '' __cella_code <&3 && IFS= read -r -d '' __cella_restore <&3; do
	eval "$__cella_set"
	__cella_cell
	__cella_rc=$?
	eval "$__cella_restore"
	if [ "$__cella_rc" != 0 ]; then
		printf '{"type":"error","name":"","value":"%d","traceback":""}\n' "$__cella_rc" >&4
	fi
	printf '\000cella-cell-end-%s\000' "$__cella_nonce" >&1
	printf '\000cella-cell-end-%s\000' "$__cella_nonce" >&2
	printf '{"type":"done"}\n' >&4
done
