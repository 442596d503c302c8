package scale

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// phase is what the control plane (or the floor) did over one window.
type phase struct {
	wall          time.Duration // the window's length
	cpu           time.Duration // the process's CPU time over it
	revs          uint64        // registry revisions (the floor: changes) in it
	sent          float64       // watch messages sent in it
	reads, writes uint64        // read and write system calls of the process
}

// Marginal is what the flips alone cost: the window with flips minus the
// quiet window before it (same fleet, same routers, no flips; scaled to the
// same length). What the process does whether or not anything changes (the
// routers' acks and observation reports, sweeps, load flushes and their
// deltas on the load grid) cancels out. A figure is zero when the flips
// added nothing to divide by.
type Marginal struct {
	PerRouterChangeUs float64 // CPU per router per extra revision, µs
	PerSentUs         float64 // CPU per extra watch message sent, µs
	// System calls per extra message sent: the writes (one per router per
	// message is the least a connection per router allows) and reads
	// (frames the routers send back because of it: HTTP/2 pings, window
	// updates).
	WritesPerSent, ReadsPerSent float64
}

func marginal(quiet, flips phase, routers int) Marginal {
	var m Marginal
	if quiet.wall <= 0 || flips.wall <= 0 || routers <= 0 {
		return m
	}
	scale := flips.wall.Seconds() / quiet.wall.Seconds()
	extra := func(w, q float64) float64 { return w - q*scale }
	extraCPU := extra(flips.cpu.Seconds(), quiet.cpu.Seconds()) * 1e6
	extraRevs := extra(float64(flips.revs), float64(quiet.revs))
	extraSent := extra(flips.sent, quiet.sent)
	if extraRevs >= 1 {
		m.PerRouterChangeUs = extraCPU / float64(routers) / extraRevs
	}
	if extraSent >= 1 {
		m.PerSentUs = extraCPU / extraSent
		m.WritesPerSent = extra(float64(flips.writes), float64(quiet.writes)) / extraSent
		m.ReadsPerSent = extra(float64(flips.reads), float64(quiet.reads)) / extraSent
	}
	return m
}

// syscalls is this process's read and write system calls so far (Linux's
// /proc/self/io; zeros elsewhere).
func syscalls() (reads, writes uint64) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// sample is the process's CPU and system calls now, with revs and sent.
func sample(revs uint64, sent float64) phase {
	p := phase{cpu: cpuTime(), revs: revs, sent: sent}
	p.reads, p.writes = syscalls()
	return p
}

// since is the phase from p0 to p1 (wall: their distance in time, given).
func since(p0, p1 phase, wall time.Duration) phase {
	return phase{wall: wall, cpu: p1.cpu - p0.cpu, revs: p1.revs - p0.revs, sent: p1.sent - p0.sent,
		reads: p1.reads - p0.reads, writes: p1.writes - p0.writes}
}
