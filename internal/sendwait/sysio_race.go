//go:build race

package sendwait

import "syscall"

// Under the race detector the runtime's calls, which tell the detector
// that the bytes passed between goroutines.
func sysRead(fd uintptr, p []byte) (int, error)  { return syscall.Read(int(fd), p) }
func sysWrite(fd uintptr, p []byte) (int, error) { return syscall.Write(int(fd), p) }
