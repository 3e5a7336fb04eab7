package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// procStat is the part of /proc/<pid>/stat the cost breakdown reads: CPU
// time in clock ticks, the process's own (utime, stime) and that of its
// children it has waited for (cutime, cstime).
type procStat struct {
	pid, ppid                    int
	utime, stime, cutime, cstime uint64
}

// parseProcStat parses one /proc/<pid>/stat line. The command name (field
// 2) is in parentheses and may itself hold spaces and parentheses, so the
// fields are counted from the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, errors.New("parse proc stat: no command name")
	}
	var st procStat
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:open])))
	if err != nil {
		return procStat{}, fmt.Errorf("parse proc stat pid: %w", err)
	}
	st.pid = pid
	// After ')': state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(string(b[end+1:]))
	const first = 3
	if len(f) < 17-first+1 {
		return procStat{}, fmt.Errorf("parse proc stat: %d fields after the command name", len(f))
	}
	if st.ppid, err = strconv.Atoi(f[4-first]); err != nil {
		return procStat{}, fmt.Errorf("parse proc stat ppid: %w", err)
	}
	for i, dst := range []*uint64{&st.utime, &st.stime, &st.cutime, &st.cstime} {
		// cutime and cstime are signed in the kernel (long) but never negative.
		v, err := strconv.ParseInt(f[14-first+i], 10, 64)
		if err != nil || v < 0 {
			return procStat{}, fmt.Errorf("parse proc stat field %d: %q", 14+i, f[14-first+i])
		}
		*dst = uint64(v)
	}
	return st, nil
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("read proc stat: %w", err)
	}
	return parseProcStat(b)
}

// ownTicks is the CPU time of the process itself.
func (s procStat) ownTicks() uint64 { return s.utime + s.stime }

// treeTicks is the CPU time of a process and its children: its own, that of
// the children it has reaped (so a Postgres backend that exits within the
// window still counts, in the postmaster's cutime), and that of the
// children still alive. A child exiting between the two reads may be
// missed or counted twice; backends of the bench's pools live for the
// whole run, so that is a tick or two at most.
func treeTicks(parent procStat, children []procStat) uint64 {
	t := parent.ownTicks() + parent.cutime + parent.cstime
	for _, c := range children {
		t += c.ownTicks()
	}
	return t
}

// childrenOf reads every process whose parent is ppid. Processes that end
// while /proc is read are skipped.
func childrenOf(ppid int) ([]procStat, error) {
	paths, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []procStat
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		st, err := parseProcStat(b)
		if err != nil || st.ppid != ppid {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

// Clock ticks per second. Go has no sysconf without cgo; glibc's
// sysconf(_SC_CLK_TCK) reads AT_CLKTCK from the auxiliary vector, so the
// bench does the same. assumedClockTicks is Linux's USER_HZ everywhere the
// bench runs, used (and said so) when the vector cannot be read.
const (
	atClkTck          = 17
	assumedClockTicks = 100
)

// clockTicks returns ticks per second and whether they were read (false:
// assumed).
func clockTicks() (int, bool) {
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return assumedClockTicks, false
	}
	if hz, ok := auxvClockTicks(b); ok {
		return hz, true
	}
	return assumedClockTicks, false
}

// auxvClockTicks finds AT_CLKTCK in an auxiliary vector of 64-bit
// little-endian (key, value) pairs.
func auxvClockTicks(b []byte) (int, bool) {
	for i := 0; i+16 <= len(b); i += 16 {
		key := binary.LittleEndian.Uint64(b[i:])
		val := binary.LittleEndian.Uint64(b[i+8:])
		if key == 0 {
			break
		}
		if key == atClkTck && val > 0 && val < 1_000_000 {
			return int(val), true
		}
	}
	return 0, false
}

// ticksToDuration converts clock ticks at hz to CPU time.
func ticksToDuration(ticks uint64, hz int) time.Duration {
	return time.Duration(ticks) * time.Second / time.Duration(hz)
}
