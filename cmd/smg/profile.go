package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

// Profiling a whole run, for benchmarks: SMG_CPU_PROFILE names a file the
// run's CPU profile is written to, SMG_ALLOCS_PROFILE one its allocations
// since start are written to as the command returns (a clean shutdown).
const (
	cpuProfileEnv    = "SMG_CPU_PROFILE"
	allocsProfileEnv = "SMG_ALLOCS_PROFILE"
)

// startProfiles starts what the environment asks for and returns the
// function that ends and writes the profiles.
func startProfiles(stderr io.Writer) (stop func()) {
	var stops []func()
	if path := os.Getenv(cpuProfileEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "smg: %s: %v\n", cpuProfileEnv, err)
		} else {
			stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
		}
	}
	if path := os.Getenv(allocsProfileEnv); path != "" {
		stops = append(stops, func() {
			f, err := os.Create(path)
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				fmt.Fprintf(stderr, "smg: %s: %v\n", allocsProfileEnv, err)
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}
