package watchclient

import "google.golang.org/grpc"

// WindowSize is the HTTP/2 flow-control window, per stream and per
// connection, of a router's connection to the control plane: larger than
// the snapshot of a 10,000-worker fleet (about 900 KiB), so a join is one
// window on any link.
const WindowSize = 4 << 20

// DialOptions are the gRPC dial options a router's connection to the
// control plane needs besides its credentials: fixed flow-control windows.
// With gRPC's default (windows sized by estimating the bandwidth-delay
// product), every burst a router receives after a quiet spell sends the
// control plane a window update and a ping, which it must read and answer:
// each delta of the fan-out cost the control plane a second read and a
// second write per router. Fixed windows send no such pings.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithInitialWindowSize(WindowSize), grpc.WithInitialConnWindowSize(WindowSize)}
}
