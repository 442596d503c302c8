package scale

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// A timed join is split where it spends its time. The joiner (a router
// process) stamps its own steps; the control plane's two are stamped in
// the measured process (its log of the router's hello, the harness's send
// log) on the same machine's wall clock:
//
//	Start      the joiner dials
//	Connected  its TCP connection is open
//	Accepted   the control plane's gRPC server accepted it
//	Ready      the joiner's stream is open (gRPC waits for the server's
//	           HTTP/2 settings before it opens a stream)
//	HelloSent  the joiner's hello is sent
//	Hello      the control plane's Watch handler has the hello
//	Sent       the control plane's Send of the snapshot returned (built or
//	           taken from the per-revision cache, handed to gRPC)
//	FirstByte  the joiner's connection has read the response's first bytes
//	           (the read that brings what came after its hello past
//	           firstBytes: HTTP/2's control frames are smaller)
//	Received   the whole message is in, handed to the codec
//	Decoded    proto.Unmarshal into the generated types is done
//
// All Unix ns; zero when unknown.
type joinSample struct {
	ID      string
	Millis  float64 // Start → Decoded
	Bytes   int
	Workers int

	Local                                                            string // the joiner's address (the control plane's accept log)
	Start, Connected, Ready, HelloSent, FirstByte, Received, Decoded int64
	Accepted, Hello, Sent                                            int64 // the control plane's, filled by the parent
}

// JoinPhases is where joins spent their time, ms (Quantiles of each step:
// see joinSample).
type JoinPhases struct {
	Connect  Quantiles // dial → the control plane has the hello
	CP       Quantiles // hello → the control plane's Send of the snapshot returned
	Wire     Quantiles // Send returned → the joiner reads the first bytes
	Transfer Quantiles // first bytes → the whole message received
	Decode   Quantiles // received → decoded
}

// joinPhases splits joins whose steps are all known.
func joinPhases(js []joinSample) JoinPhases {
	var c, cp, w, t, d []float64
	ms := func(a, b int64) float64 { return float64(b-a) / 1e6 }
	for _, j := range js {
		if j.Hello == 0 || j.Sent == 0 || j.FirstByte == 0 {
			continue
		}
		c, cp, w = append(c, ms(j.Start, j.Hello)), append(cp, ms(j.Hello, j.Sent)), append(w, ms(j.Sent, j.FirstByte))
		t, d = append(t, ms(j.FirstByte, j.Received)), append(d, ms(j.Received, j.Decoded))
	}
	return JoinPhases{quantiles(c), quantiles(cp), quantiles(w), quantiles(t), quantiles(d)}
}

// join is one timed join: dial, hello, the first message decoded.
func (p *routerProc) join(ctx context.Context, id string) (joinSample, error) {
	s := joinSample{ID: id, Start: time.Now().UnixNano()}
	var conn *firstRead
	cc, err := grpc.NewClient(p.spec.Addr, append(p.dialOptions(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			conn = &firstRead{Conn: c}
			s.Connected, s.Local = time.Now().UnixNano(), c.LocalAddr().String()
			return conn, nil
		}))...)
	if err != nil {
		return s, err
	}
	defer cc.Close()
	st, err := cc.NewStream(ctx, &smgv1.WatchService_ServiceDesc.Streams[0], smgv1.WatchService_Watch_FullMethodName,
		grpc.ForceCodec(timedCodec{&s}))
	if err == nil {
		s.Ready = time.Now().UnixNano()
		conn.armed.Store(true) // what comes after the hello is the response
		err = st.SendMsg(&smgv1.WatchRequest{Msg: &smgv1.WatchRequest_Hello{Hello: &smgv1.WatchHello{RouterId: id}}})
		s.HelloSent = time.Now().UnixNano()
	}
	var m smgv1.WatchResponse
	if err == nil {
		err = st.RecvMsg(&m)
	}
	if err != nil {
		return s, err
	}
	if m.GetSnapshot() == nil {
		return s, fmt.Errorf("first message %v: want a snapshot", m.GetMsg())
	}
	s.FirstByte = conn.at.Load()
	s.Millis = float64(s.Decoded-s.Start) / 1e6
	s.Bytes, s.Workers = proto.Size(&m), len(m.GetSnapshot().GetWorkers())
	return s, nil
}

// firstRead is a connection that notes when the bytes it has read since
// armed reached firstBytes.
type firstRead struct {
	net.Conn
	armed atomic.Bool
	n     atomic.Int64
	at    atomic.Int64
}

// firstBytes is more than HTTP/2's control frames (a settings frame and
// its ack, a ping, a window update: a few dozen bytes each) and less than
// a snapshot's first data frame.
const firstBytes = 512

func (c *firstRead) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.armed.Load() && c.at.Load() == 0 && c.n.Add(int64(n)) >= firstBytes {
		c.at.Store(time.Now().UnixNano())
	}
	return n, err
}

// timedCodec is the proto codec, stamping when a response reached it
// (received whole) and when it was decoded.
type timedCodec struct{ s *joinSample }

func (timedCodec) Name() string { return "proto" }

func (timedCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }

func (c timedCodec) Unmarshal(data []byte, v any) error {
	c.s.Received = time.Now().UnixNano()
	err := proto.Unmarshal(data, v.(proto.Message))
	c.s.Decoded = time.Now().UnixNano()
	return err
}

// logJoins logs each timed join's steps, ms after its dial.
func logJoins(w io.Writer, name string, js []joinSample) {
	for _, j := range js {
		at := func(t int64) string {
			if t == 0 {
				return "?"
			}
			return fmt.Sprintf("%.1f", float64(t-j.Start)/1e6)
		}
		fmt.Fprintf(w, "scale %s: join %s (%s) %.1f ms: connected %s, accepted %s, stream ready %s, hello sent %s, hello at the control plane %s, its send returned %s, first bytes %s, received %s, decoded %s\n",
			name, j.ID, j.Local, j.Millis, at(j.Connected), at(j.Accepted), at(j.Ready), at(j.HelloSent), at(j.Hello), at(j.Sent), at(j.FirstByte), at(j.Received), at(j.Decoded))
	}
}

// acceptLog is the control plane's listener, noting when each connection
// was accepted by its remote address (a timed joiner's Local).
type acceptLog struct {
	net.Listener
	at sync.Map // remote address → Unix ns
}

func (l *acceptLog) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.at.Store(c.RemoteAddr().String(), time.Now().UnixNano())
		if trace.IsEnabled() { // Config.Trace
			trace.Log(context.Background(), "accept", c.RemoteAddr().String())
		}
	}
	return c, err
}
