# ql3 per-attempt shim (POSIX sh, run as `sh -c <this> sh [file args...]`).
# It leads the attempt's process group: it runs the command as a foreground child, publishes the
# completion receipt, and exits with the command's status. Inputs arrive as QL3_SHIM_* environment
# variables (argv is readable by every local user) and are removed before the command starts.
_ql3_on_signal() { :; }
# A handler, not an ignore: children start with default dispositions. A trapped signal does not cut
# short a foreground wait (the handler runs after it), so $? below is always the real exit status.
# A background child + `wait` would not do: sh makes async lists ignore INT and QUIT for good.
# Known gap: a signal landing in the instant between the fork below and the child's reset to default
# dispositions runs the inherited no-op handler; a stop then ends the group with the KILL after grace.
trap _ql3_on_signal TERM INT HUP
_ql3_mode=$QL3_SHIM_MODE _ql3_cmd=$QL3_SHIM_COMMAND _ql3_cwd=$QL3_SHIM_CWD _ql3_sh=$QL3_SHIM_SH
_ql3_head=$QL3_SHIM_HEAD _ql3_start=$QL3_SHIM_STARTED _ql3_base=$QL3_SHIM_CLOCK_BASE
_ql3_dst=$QL3_SHIM_DST _ql3_dir=$QL3_SHIM_DIR
_ql3_sync=$QL3_SHIM_SYNC _ql3_boot=$QL3_SHIM_BOOT _ql3_idf=$QL3_SHIM_IDENTITY
_ql3_umask=$QL3_SHIM_UMASK _ql3_as=$QL3_SHIM_AS
unset QL3_SHIM_MODE QL3_SHIM_COMMAND QL3_SHIM_CWD QL3_SHIM_SH QL3_SHIM_HEAD QL3_SHIM_STARTED \
  QL3_SHIM_CLOCK_BASE QL3_SHIM_DST QL3_SHIM_DIR QL3_SHIM_SYNC \
  QL3_SHIM_BOOT QL3_SHIM_IDENTITY QL3_SHIM_UMASK QL3_SHIM_AS
# The shim's own failures never reach the log (it must never show the cwd or the command): its stderr
# is /dev/null from here on, once, instead of a redirection (and its save and restore) per step. The
# log's descriptor waits on 5 for the command, which gets it back as its stderr when it is exec'd.
exec 5>&2 2>/dev/null
# _ql3_as: empty, or the task user's `setpriv ... --` words (no spaces or globs in any of them); the
# command execs through it, the shim stays the server's user to publish the receipt.

# Launch identity (boot id, pid, start ticks), written before the command starts: the caller may die
# between the spawn and journaling the handle, and a restarted caller finds the process from this.
# The start ticks come from the launcher on descriptor 3, read from our /proc/<pid>/stat for its own
# handle: one short line, where `read` of /proc/$$/stat would take some 300 one-byte read(2) calls.
# No line (the launcher died before it captured us): nothing may start, and no receipt is written.
# The file is created (noclobber: O_EXCL, mode 0600) before the wait, so that making its inode overlaps
# the launcher's capture, and written after it; without the line it stays empty, which is no evidence.
# If the file cannot be made, descriptor 4 stays closed (nothing else can hold it: the launcher passes
# only 0-3) and the printf into it fails quietly: the command starts without the evidence, as before.
# The shim's own files are all made this way: umask 077 and noclobber stay set for the shim's whole
# life; the command's subshell restores the server's umask just before its exec (noclobber is a shell
# option: the exec'd program does not inherit it).
set -C
umask 077 && command exec 4>"$_ql3_idf"
read -r _ql3_st <&3 || exit 125
case $_ql3_st in '' | *[!0-9]*) exit 125 ;; esac
printf '%s %s %s\n' "$_ql3_boot" "$$" "$_ql3_st" >&4
exec 3<&- 4>&-

# Failures before the command runs stay out of the log (stderr is still /dev/null); the exec gives the
# command the log as its stderr and closes descriptor 5.
if [ "$_ql3_mode" = argv ]; then
  (
    if [ -n "$_ql3_cwd" ]; then cd "$_ql3_cwd" || exit 126; unset OLDPWD; fi
    case $1 in
      */*) [ -e "$1" ] || exit 127; [ -f "$1" ] && [ -x "$1" ] || exit 126 ;;
      *) command -v "$1" >/dev/null || exit 127 ;;
    esac
    umask "$_ql3_umask"
    exec $_ql3_as "$@" 2>&5 5>&-
  )
else
  (
    if [ -n "$_ql3_cwd" ]; then cd "$_ql3_cwd" || exit 126; unset OLDPWD; fi
    umask "$_ql3_umask"
    exec $_ql3_as "$_ql3_sh" -c "$_ql3_cmd" 2>&5 5>&-
  )
fi
_ql3_rc=$?

# finishedAtMs = (startedAtMs - boot time at launch) + boot time now, from /proc/uptime: no date(1) exec.
_ql3_fin=$_ql3_start
if read -r _ql3_up _ql3_idle </proc/uptime; then
  case $_ql3_up in
    *[0-9].[0-9][0-9])
      _ql3_cs=${_ql3_up#*.}
      _ql3_fin=$((_ql3_base + ${_ql3_up%.*} * 1000 + ${_ql3_cs%?} * 100 + ${_ql3_cs#?} * 10))
      ;;
  esac
fi
[ "$_ql3_fin" -ge "$_ql3_start" ] || _ql3_fin=$_ql3_start

# Publish: the launcher reserved the receipt's file before the spawn (RESERVED_RECEIPT_BYTES of NUL,
# allocated, created with O_EXCL so no earlier receipt is ever replaced), and one printf fills it in
# place from offset 0: `1<>` opens it read-write without truncating, so the write needs no new space
# even on a full disk. The newline comes last: a reader drops the NUL padding and takes what is left
# without that newline (the reservation untouched, a write in progress, or one cut short by the shim's
# death) for no receipt: never valid, never quarantined (execution/receipts.py). No temp file and no
# ln(1): one process per run fewer. Any failure here only means "no receipt"; the exit status stays the
# command's (umask 077 is still set from the start, should the file have to be created).
if printf '%s%s,"exitCode":%s}\n' "$_ql3_head" "$_ql3_fin" "$_ql3_rc" 1<>"$_ql3_dst"; then
  if [ -n "$_ql3_sync" ]; then
    "$_ql3_sync" "$_ql3_dst" && "$_ql3_sync" "$_ql3_dir"
  fi
fi
exit "$_ql3_rc"
