package agent

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	smgv1 "github.com/smg-project/smg/gen/smg/v1"
)

// sentStream records what the agent sends.
type sentStream struct {
	grpc.BidiStreamingClient[smgv1.ReportRequest, smgv1.ReportResponse]
	sent []*smgv1.ReportRequest
}

func (s *sentStream) Send(m *smgv1.ReportRequest) error { s.sent = append(s.sent, m); return nil }

func rec(url string) *smgv1.ReportRequest {
	return &smgv1.ReportRequest{Msg: &smgv1.ReportRequest_Record{Record: &smgv1.LoadRecord{WorkerUrl: url}}}
}

// shape describes messages: a record by URL, a batch as [urls], an event as !url.
func shape(msgs []*smgv1.ReportRequest) []string {
	var out []string
	for _, m := range msgs {
		switch {
		case m.GetRecord() != nil:
			out = append(out, m.GetRecord().GetWorkerUrl())
		case m.GetRecords() != nil:
			s := "["
			for i, r := range m.GetRecords().GetRecords() {
				if i > 0 {
					s += " "
				}
				s += r.GetWorkerUrl()
			}
			out = append(out, s+"]")
		default:
			out = append(out, "!"+m.GetEvent().GetWorkerUrl())
		}
	}
	return out
}

// To a control plane that accepts LoadRecords, each run of records due at
// once goes in one message (at most maxBatch), events keep their place, and
// the records metric still counts records; to one that does not (an older
// control plane would ignore the message), every record goes alone.
func TestRecordsDueAtOnceGoInOneMessage(t *testing.T) {
	ev := eventMsg("e", smgv1.EngineEventKind_ENGINE_EVENT_KIND_CONTACT, "", newClock().Now())
	msgs := []*smgv1.ReportRequest{rec("a"), rec("b"), rec("c"), ev, rec("d"), rec("f"), rec("g"), rec("h")}
	for _, tc := range []struct {
		batch bool
		want  []string
	}{
		{false, []string{"a", "b", "c", "!e", "d", "f", "g", "h"}},
		{true, []string{"[a b c]", "!e", "[d f g h]"}},
	} {
		m, err := newMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		a := &Agent{m: m, opts: Options{Now: newClock().Now}}
		st := &sentStream{}
		if err := a.send(st, msgs, tc.batch); err != nil {
			t.Fatal(err)
		}
		if got := shape(st.sent); !slices.Equal(got, tc.want) {
			t.Errorf("batch %v: sent %v, want %v", tc.batch, got, tc.want)
		}
		if got := testutil.ToFloat64(a.m.sent.WithLabelValues("record")); got != 7 {
			t.Errorf("batch %v: records counted %v, want 7", tc.batch, got)
		}
	}
	// A run longer than the bound is split; a run of one stays a record.
	if got, want := shape(batched([]*smgv1.ReportRequest{rec("a"), rec("b"), rec("c"), ev, rec("d")}, 2)),
		[]string{"[a b]", "c", "!e", "d"}; !slices.Equal(got, want) {
		t.Errorf("batched with a bound of 2: %v, want %v", got, want)
	}
}
