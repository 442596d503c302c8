package router

// pdPools are the two pools a disaggregated request draws its pair from: the
// policy picks each leg in its own pool, so vetoes apply to each leg.
type pdPools struct {
	prefill, decode *pool
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
