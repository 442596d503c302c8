package bearer

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name       string
		vals       []string
		sent, okay bool
	}{
		{"none", nil, false, false},
		{"right", []string{"Bearer s3cret"}, true, true},
		{"wrong", []string{"Bearer nope"}, true, false},
		{"not bearer", []string{"Basic s3cret"}, true, false},
		{"prefix of the token", []string{"Bearer s3cre"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.vals != nil {
				ctx = metadata.NewIncomingContext(ctx, metadata.MD{"authorization": tc.vals})
			}
			sent, ok := Check(ctx, "s3cret")
			if sent != tc.sent || ok != tc.okay {
				t.Fatalf("Check = (%v, %v), want (%v, %v)", sent, ok, tc.sent, tc.okay)
			}
		})
	}
}
