package router

import (
	"slices"
	"strings"

	"github.com/smg-project/smg/internal/enginegrpc"
)

// pdPools are the two pools a disaggregated request draws its pair from: the
// policy picks each leg in its own pool, so vetoes apply to each leg.
type pdPools struct {
	prefill, decode *pool
	// pairs are the protocols (1 << protocol) spoken by both a prefill and
	// a decode worker: a pair is formed within one protocol only, as the
	// legs must agree on the prompt's token ids. prefillProto and
	// decodeProto are each leg's protocols, for the refusal's message.
	pairs, prefillProto, decodeProto uint8
}

// pdMembers collects PD workers by model while a view is built.
type pdMembers struct {
	prefill, decode map[string][]int32
	allP, allD      []int32
}

func newPDMembers() *pdMembers {
	return &pdMembers{prefill: make(map[string][]int32), decode: make(map[string][]int32)}
}

func (m *pdMembers) add(w *Worker, i int32) {
	switch w.Type {
	case TypePrefill:
		m.prefill[w.Model] = append(m.prefill[w.Model], i)
		m.allP = append(m.allP, i)
	case TypeDecode:
		m.decode[w.Model] = append(m.decode[w.Model], i)
		m.allD = append(m.allD, i)
	}
}

// buildPD compiles the PD pools of models that have both prefill and decode
// workers. Pool keys are prefixed so that rings and round-robin counters
// carried over from prev never mix with the regular pools.
func (v *view) buildPD(m *pdMembers, prev *view) {
	v.pd = make(map[string]*pdPools)
	for model, pIdx := range m.prefill {
		dIdx, ok := m.decode[model]
		if !ok {
			continue
		}
		v.pd[model] = &pdPools{
			prefill: v.newPool(model, pIdx, prevPD(prev, model, false, true), nil),
			decode:  v.newPool(model, dIdx, prevPD(prev, model, false, false), nil),
		}
		v.pd[model].prefill.kind, v.pd[model].decode.kind = TypePrefill, TypeDecode
		v.pd[model].pairs, v.pd[model].prefillProto, v.pd[model].decodeProto = pairProtocols(v, pIdx, dIdx)
		if _, regular := v.pools[model]; !regular {
			v.models = append(v.models, model)
		}
	}
	if len(m.allP) > 0 && len(m.allD) > 0 {
		v.pdAll = &pdPools{
			prefill: v.newPool("", m.allP, prevPD(prev, "", true, true), nil),
			decode:  v.newPool("", m.allD, prevPD(prev, "", true, false), nil),
		}
		v.pdAll.prefill.kind, v.pdAll.decode.kind = TypePrefill, TypeDecode
		v.pdAll.pairs, v.pdAll.prefillProto, v.pdAll.decodeProto = pairProtocols(v, m.allP, m.allD)
	}
}

func prevPD(prev *view, model string, all, prefill bool) *pool {
	if prev == nil {
		return nil
	}
	pp := prev.pdAll
	if !all {
		pp = prev.pd[model]
	}
	if pp == nil {
		return nil
	}
	if prefill {
		return pp.prefill
	}
	return pp.decode
}

// protocol is what a worker speaks: a prefill/decode pair speaks one.
type protocol uint8

const (
	protoAny  protocol = 0
	protoHTTP protocol = 1
	protoGRPC protocol = 2
)

func protocolOf(url string) protocol {
	if enginegrpc.IsGRPC(url) {
		return protoGRPC
	}
	return protoHTTP
}

func (p protocol) String() string {
	switch p {
	case protoHTTP:
		return "HTTP"
	case protoGRPC:
		return "gRPC"
	}
	return "HTTP and gRPC"
}

// pairProtocols returns the protocols spoken by both a prefill and a decode
// worker of the pools (a bit set of 1 << protocol), and the protocols of
// each leg.
func pairProtocols(v *view, prefill, decode []int32) (pairs, p, d uint8) {
	for _, i := range prefill {
		p |= 1 << v.hot.at(i).proto
	}
	for _, i := range decode {
		d |= 1 << v.hot.at(i).proto
	}
	return p & d, p, d
}

// unpairedMessage explains why a model's PD workers form no pair.
func (pp *pdPools) unpairedMessage(model string) string {
	return "No prefill/decode pair" + forModel(model) + ": its prefill workers speak " + protoSet(pp.prefillProto) +
		" and its decode workers " + protoSet(pp.decodeProto) + "; both legs of a pair must speak one protocol"
}

func protoSet(set uint8) string {
	switch set {
	case 1 << protoHTTP:
		return protoHTTP.String()
	case 1 << protoGRPC:
		return protoGRPC.String()
	}
	return protoAny.String()
}

// unpaired lists the models (sorted) whose PD workers form no pair for want
// of a prefill and a decode worker speaking one protocol.
func (v *view) unpaired() string {
	var out []string
	for model, pp := range v.pd {
		if pp.pairs == 0 {
			out = append(out, model+" (prefill "+protoSet(pp.prefillProto)+", decode "+protoSet(pp.decodeProto)+")")
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
