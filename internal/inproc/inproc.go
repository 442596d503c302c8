// Package inproc calls a gRPC service in the same process through the
// interceptors its server runs, without a network hop: the control plane's
// REST gateway uses it so that a REST call meets the same authorization and
// leader-forwarding rules as a gRPC call. It serves unary methods only and
// knows nothing of the services it calls.
package inproc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Conn is a grpc.ClientConnInterface whose calls run desc's handlers on
// impl, through interceptor (nil: none).
type Conn struct {
	methods     map[string]grpc.MethodDesc // by full method name
	impl        any
	interceptor grpc.UnaryServerInterceptor
}

// New returns a Conn serving desc's unary methods on impl.
func New(desc *grpc.ServiceDesc, impl any, interceptor grpc.UnaryServerInterceptor) *Conn {
	c := &Conn{methods: map[string]grpc.MethodDesc{}, impl: impl, interceptor: interceptor}
	for _, m := range desc.Methods {
		c.methods["/"+desc.ServiceName+"/"+m.MethodName] = m
	}
	return c
}

// Invoke runs method as the server would: the caller's outgoing metadata
// arrives as incoming metadata, and the headers the handler sets
// (grpc.SetHeader) come back through grpc.Header call options.
func (c *Conn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	m, ok := c.methods[method]
	if !ok {
		return status.Errorf(codes.Unimplemented, "unknown method %s", method)
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	st := &serverStream{method: method}
	ctx = grpc.NewContextWithServerTransportStream(metadata.NewIncomingContext(ctx, md.Copy()), st)
	dec := func(v any) error {
		proto.Merge(v.(proto.Message), args.(proto.Message))
		return nil
	}
	resp, err := m.Handler(c.impl, ctx, dec, c.interceptor)
	for _, o := range opts {
		if h, ok := o.(grpc.HeaderCallOption); ok {
			*h.HeaderAddr = st.header
		}
	}
	if err != nil {
		return err
	}
	proto.Merge(reply.(proto.Message), resp.(proto.Message))
	return nil
}

// NewStream refuses: no stream is served in process.
func (c *Conn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "inproc: streams are not served in process")
}

// serverStream collects the headers a handler sets.
type serverStream struct {
	method string
	header metadata.MD
}

func (s *serverStream) Method() string { return s.method }

func (s *serverStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *serverStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *serverStream) SetTrailer(metadata.MD) error { return nil }
