package enginegrpc

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	sglangpb "github.com/smg-project/smg/gen/sglang/grpc/scheduler"
	commonpb "github.com/smg-project/smg/gen/smg/grpc/common"
	vllmpb "github.com/smg-project/smg/gen/vllm/grpc/engine"
)

// The upstream engine protocol (SMG's crates/grpc_client/proto), written
// down from its field numbers and types for the messages smg uses, plus a
// few fields smg leaves out (to prove they are skipped). One line per field:
// name=number:type, then ",opt" (proto3 optional), ",rep" (repeated) or
// "|oneof" (member of that oneof). A type starting with "." is a message of
// the same package; "smg.grpc.common.X" and "google.protobuf.Struct" name
// other packages.
var upstream = map[string]map[string]string{
	"smg.grpc.common": {
		"GetTokenizerRequest":      ``,
		"GetTokenizerChunk":        `data=1:bytes sha256=2:string`,
		"SubscribeKvEventsRequest": `start_sequence_number=1:uint64`,
		"KvEventBatch":             `sequence_number=1:uint64 timestamp=2:double events=3:.KvCacheEvent,rep dp_rank=4:int32,opt`,
		"KvCacheEvent":             `event_id=1:uint64 stored=2:.KvBlocksStored|data removed=3:.KvBlocksRemoved|data cleared=4:.KvCacheCleared|data`,
		"KvBlocksStored":           `blocks=1:.KvBlock,rep parent_block_hash=2:int64,opt`,
		"KvBlock":                  `block_hash=1:int64 token_ids=2:uint32,rep block_size=3:int32 lora_id=4:int64,opt cache_level=5:int32,opt`,
		"KvBlocksRemoved":          `block_hashes=1:int64,rep cache_level=2:int32,opt`,
		"KvCacheCleared":           ``,
	},
	"sglang.grpc.scheduler": {
		"SamplingParams": `temperature=1:float top_p=2:float top_k=3:int32 min_p=4:float frequency_penalty=5:float
			presence_penalty=6:float repetition_penalty=7:float max_new_tokens=8:uint32,opt stop=9:string,rep
			stop_token_ids=10:uint32,rep skip_special_tokens=11:bool spaces_between_special_tokens=12:bool
			regex=13:string|constraint json_schema=14:string|constraint n=17:uint32 min_new_tokens=18:uint32
			ignore_eos=19:bool no_stop_trim=20:bool stream_interval=21:int32,opt custom_params=23:google.protobuf.Struct`,
		"DisaggregatedParams": `bootstrap_host=1:string bootstrap_port=2:int32 bootstrap_room=3:int32`,
		"GenerateRequest": `request_id=1:string tokenized=2:.TokenizedInput sampling_params=4:.SamplingParams
			return_logprob=5:bool logprob_start_len=6:int32 top_logprobs_num=7:int32 disaggregated_params=10:.DisaggregatedParams lora_id=15:string
			data_parallel_rank=16:int32 stream=17:bool require_reasoning=18:bool`,
		"TokenizedInput":   `original_text=1:string input_ids=2:uint32,rep`,
		"GenerateResponse": `request_id=1:string chunk=2:.GenerateStreamChunk|response complete=3:.GenerateComplete|response`,
		"GenerateStreamChunk": `token_ids=1:uint32,rep prompt_tokens=2:uint32 completion_tokens=3:uint32 cached_tokens=4:uint32
			output_logprobs=5:.OutputLogProbs hidden_states=6:float,rep index=8:uint32 reasoning_tokens=9:uint32`,
		"GenerateComplete": `output_ids=1:uint32,rep finish_reason=2:string prompt_tokens=3:uint32 completion_tokens=4:uint32
			cached_tokens=5:uint32 output_logprobs=6:.OutputLogProbs matched_token_id=8:uint32|matched_stop matched_stop_str=9:string|matched_stop
			index=11:uint32 reasoning_tokens=12:uint32`,
		"OutputLogProbs":      `token_logprobs=1:float,rep token_ids=2:uint32,rep top_logprobs=3:.TopLogProbs,rep`,
		"TopLogProbs":         `values=1:float,rep token_ids=2:uint32,rep`,
		"HealthCheckRequest":  ``,
		"HealthCheckResponse": `healthy=1:bool message=2:string`,
		"AbortRequest":        `request_id=1:string reason=2:string`,
		"AbortResponse":       `success=1:bool message=2:string`,
		"GetModelInfoRequest": ``,
		"GetModelInfoResponse": `model_path=1:string tokenizer_path=2:string is_generation=3:bool preferred_sampling_params=4:string
			weight_version=5:string served_model_name=6:string max_context_length=7:int32 vocab_size=8:int32 supports_vision=9:bool
			model_type=10:string eos_token_ids=11:int32,rep pad_token_id=12:int32 bos_token_id=13:int32 max_req_input_len=14:int32
			architectures=15:string,rep id2label_json=16:string num_labels=17:int32 default_sampling_params_json=20:string`,
		"GetServerInfoRequest": ``,
		"GetServerInfoResponse": `server_args=1:google.protobuf.Struct scheduler_info=2:google.protobuf.Struct active_requests=3:int32
			is_paused=4:bool last_receive_timestamp=5:double uptime_seconds=6:double sglang_version=7:string server_type=8:string
			max_total_num_tokens=10:int32`,
		"GetLoadsRequest":  `dp_rank=1:int32,opt include=2:string,rep`,
		"GetLoadsResponse": `timestamp=1:string version=2:string dp_rank_count=3:int32 loads=4:.SchedulerLoad,rep aggregate=5:.AggregateMetrics`,
		"SchedulerLoad": `dp_rank=1:int32 num_running_reqs=2:int32 num_waiting_reqs=3:int32 num_total_reqs=4:int32
			num_used_tokens=5:int32 max_total_num_tokens=6:int32 token_usage=7:double gen_throughput=8:double
			cache_hit_rate=9:double utilization=10:double max_running_requests=11:int32 num_waiting_uncached_tokens=17:int32`,
		"AggregateMetrics": `total_running_reqs=1:int32 total_waiting_reqs=2:int32 total_reqs=3:int32 avg_token_usage=4:double
			avg_throughput=5:double avg_utilization=6:double`,
	},
	"vllm.grpc.engine": {
		"SamplingParams": `temperature=1:float,opt top_p=2:float top_k=3:uint32 min_p=4:float frequency_penalty=5:float
			presence_penalty=6:float repetition_penalty=7:float max_tokens=8:uint32,opt min_tokens=9:uint32 stop=10:string,rep
			stop_token_ids=11:uint32,rep skip_special_tokens=12:bool spaces_between_special_tokens=13:bool ignore_eos=14:bool
			n=15:uint32 json_schema=16:string|constraint regex=17:string|constraint logprobs=22:int32,opt seed=24:int32,opt`,
		"TokenizedInput": `original_text=1:string input_ids=2:uint32,rep`,
		"GenerateRequest": `request_id=1:string tokenized=2:.TokenizedInput|input text=3:string|input sampling_params=4:.SamplingParams
			stream=5:bool kv_transfer_params_json=8:string,opt data_parallel_rank=9:int32,opt`,
		"GenerateResponse": `chunk=1:.GenerateStreamChunk|response complete=2:.GenerateComplete|response`,
		"GenerateStreamChunk": `token_ids=1:uint32,rep prompt_tokens=2:uint32 completion_tokens=3:uint32 cached_tokens=4:uint32
			output_logprobs=5:.OutputLogProbs index=7:uint32`,
		"GenerateComplete": `output_ids=1:uint32,rep finish_reason=2:string prompt_tokens=3:uint32 completion_tokens=4:uint32
			cached_tokens=5:uint32 output_logprobs=6:.OutputLogProbs index=8:uint32 matched_token_id=10:uint32|matched_stop
			matched_stop_str=11:string|matched_stop kv_transfer_params_json=12:string,opt`,
		"OutputLogProbs":      `token_logprobs=1:float,rep token_ids=2:uint32,rep top_logprobs=3:.TopLogProbs,rep`,
		"TopLogProbs":         `values=1:float,rep token_ids=2:uint32,rep`,
		"HealthCheckRequest":  ``,
		"HealthCheckResponse": `healthy=1:bool message=2:string`,
		"AbortRequest":        `request_ids=1:string,rep`,
		"AbortResponse":       ``,
		"GetModelInfoRequest": ``,
		"GetModelInfoResponse": `model_path=1:string is_generation=2:bool max_context_length=3:uint32 vocab_size=4:uint32 supports_vision=5:bool
			served_model_name=6:string tokenizer_path=7:string model_type=8:string architectures=9:string,rep eos_token_ids=10:int32,rep
			pad_token_id=11:int32 bos_token_id=12:int32 max_req_input_len=13:int32 default_sampling_params_json=14:string`,
		"GetServerInfoRequest": ``,
		"GetServerInfoResponse": `active_requests=1:uint32 is_paused=2:bool last_receive_timestamp=3:double uptime_seconds=4:double
			server_type=5:string kv_connector=6:string kv_role=7:string kv_engine_id=8:string data_parallel_size=9:int32 shm_namespace_id=10:string`,
		"GetLoadsRequest":  `dp_rank=1:int32,opt include=2:string,rep`,
		"GetLoadsResponse": `timestamp=1:string version=2:string dp_rank_count=3:int32 loads=4:.SchedulerLoad,rep`,
		"SchedulerLoad": `dp_rank=1:int32 num_running_reqs=2:int32 num_waiting_reqs=3:int32 num_total_reqs=4:int32
			num_used_tokens=5:int32 max_total_num_tokens=6:int32 token_usage=7:double gen_throughput=8:double
			cache_hit_rate=9:double utilization=10:double max_running_requests=11:int32`,
	},
}

// extensionMin and extensionMax bound smg's own field numbers.
const extensionMin, extensionMax = 50000, 50099

var scalarTypes = map[string]descriptorpb.FieldDescriptorProto_Type{
	"double": descriptorpb.FieldDescriptorProto_TYPE_DOUBLE, "float": descriptorpb.FieldDescriptorProto_TYPE_FLOAT,
	"int32": descriptorpb.FieldDescriptorProto_TYPE_INT32, "int64": descriptorpb.FieldDescriptorProto_TYPE_INT64,
	"uint32": descriptorpb.FieldDescriptorProto_TYPE_UINT32, "uint64": descriptorpb.FieldDescriptorProto_TYPE_UINT64,
	"bool": descriptorpb.FieldDescriptorProto_TYPE_BOOL, "string": descriptorpb.FieldDescriptorProto_TYPE_STRING,
	"bytes": descriptorpb.FieldDescriptorProto_TYPE_BYTES,
}

// upstreamFiles builds the upstream descriptors into a registry of their own.
func upstreamFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	files := new(protoregistry.Files)
	st, err := protoregistry.GlobalFiles.FindFileByPath(structpb.File_google_protobuf_struct_proto.Path())
	if err != nil {
		t.Fatal(err)
	}
	if err := files.RegisterFile(st); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"smg.grpc.common", "sglang.grpc.scheduler", "vllm.grpc.engine"} {
		fd := &descriptorpb.FileDescriptorProto{
			Name: proto.String("upstream/" + pkg + ".proto"), Package: proto.String(pkg), Syntax: proto.String("proto3"),
			Dependency: []string{"google/protobuf/struct.proto"},
		}
		if pkg != "smg.grpc.common" {
			fd.Dependency = append(fd.Dependency, "upstream/smg.grpc.common.proto")
		}
		for name, spec := range upstream[pkg] {
			fd.MessageType = append(fd.MessageType, upstreamMessage(t, pkg, name, spec))
		}
		f, err := protodesc.NewFile(fd, files)
		if err != nil {
			t.Fatalf("upstream %s: %v", pkg, err)
		}
		if err := files.RegisterFile(f); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func upstreamMessage(t *testing.T, pkg, name, spec string) *descriptorpb.DescriptorProto {
	m := &descriptorpb.DescriptorProto{Name: proto.String(name)}
	oneofs := map[string]int32{}
	oneofIndex := func(n string) *int32 {
		i, ok := oneofs[n]
		if !ok {
			i = int32(len(m.OneofDecl))
			m.OneofDecl = append(m.OneofDecl, &descriptorpb.OneofDescriptorProto{Name: proto.String(n)})
			oneofs[n] = i
		}
		return proto.Int32(i)
	}
	var optional []*descriptorpb.FieldDescriptorProto
	for _, tok := range strings.Fields(spec) {
		nameNum, typ, ok := strings.Cut(tok, ":")
		fname, num, ok2 := strings.Cut(nameNum, "=")
		if !ok || !ok2 {
			t.Fatalf("%s.%s: bad field %q", pkg, name, tok)
		}
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatal(err)
		}
		f := &descriptorpb.FieldDescriptorProto{Name: proto.String(fname), Number: proto.Int32(int32(n)),
			JsonName: proto.String(protoJSONName(fname)), Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
		typ, oneof, isOneof := strings.Cut(typ, "|")
		typ, mod, _ := strings.Cut(typ, ",")
		switch mod {
		case "rep":
			f.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		case "opt":
			f.Proto3Optional = proto.Bool(true)
			optional = append(optional, f)
		}
		if isOneof {
			f.OneofIndex = oneofIndex(oneof)
		}
		if st, ok := scalarTypes[typ]; ok {
			f.Type = st.Enum()
		} else {
			f.Type = descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum()
			if strings.HasPrefix(typ, ".") {
				typ = pkg + typ
			}
			f.TypeName = proto.String("." + typ)
		}
		m.Field = append(m.Field, f)
	}
	for _, f := range optional { // synthetic oneofs come after the real ones
		f.OneofIndex = oneofIndex("_" + f.GetName())
	}
	return m
}

func protoJSONName(s string) string {
	var b strings.Builder
	up := false
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up {
			r = []rune(strings.ToUpper(string(r)))[0]
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ours lists one message of every generated type smg uses.
func ours() []proto.Message {
	return []proto.Message{
		&commonpb.GetTokenizerRequest{}, &commonpb.GetTokenizerChunk{}, &commonpb.SubscribeKvEventsRequest{},
		&commonpb.KvEventBatch{}, &commonpb.KvCacheEvent{}, &commonpb.KvBlocksStored{}, &commonpb.KvBlock{},
		&commonpb.KvBlocksRemoved{}, &commonpb.KvCacheCleared{},
		&sglangpb.SamplingParams{}, &sglangpb.DisaggregatedParams{}, &sglangpb.GenerateRequest{}, &sglangpb.TokenizedInput{},
		&sglangpb.GenerateResponse{}, &sglangpb.GenerateStreamChunk{}, &sglangpb.GenerateComplete{},
		&sglangpb.HealthCheckRequest{}, &sglangpb.HealthCheckResponse{}, &sglangpb.AbortRequest{}, &sglangpb.AbortResponse{},
		&sglangpb.GetModelInfoRequest{}, &sglangpb.GetModelInfoResponse{}, &sglangpb.GetServerInfoRequest{},
		&sglangpb.GetServerInfoResponse{}, &sglangpb.GetLoadsRequest{}, &sglangpb.GetLoadsResponse{},
		&sglangpb.SchedulerLoad{}, &sglangpb.AggregateMetrics{}, &sglangpb.OutputLogProbs{}, &sglangpb.TopLogProbs{},
		&vllmpb.SamplingParams{}, &vllmpb.TokenizedInput{}, &vllmpb.GenerateRequest{}, &vllmpb.GenerateResponse{},
		&vllmpb.GenerateStreamChunk{}, &vllmpb.GenerateComplete{}, &vllmpb.HealthCheckRequest{}, &vllmpb.HealthCheckResponse{},
		&vllmpb.AbortRequest{}, &vllmpb.AbortResponse{}, &vllmpb.GetModelInfoRequest{}, &vllmpb.GetModelInfoResponse{},
		&vllmpb.GetServerInfoRequest{}, &vllmpb.GetServerInfoResponse{}, &vllmpb.GetLoadsRequest{}, &vllmpb.GetLoadsResponse{},
		&vllmpb.SchedulerLoad{}, &vllmpb.OutputLogProbs{}, &vllmpb.TopLogProbs{},
	}
}

// TestFieldsMatchUpstream: every field smg declares has upstream's number,
// type, cardinality, presence and oneof, unless it is one of smg's
// extensions, whose numbers upstream does not use.
func TestFieldsMatchUpstream(t *testing.T) {
	files := upstreamFiles(t)
	seen := 0
	for _, m := range ours() {
		md := m.ProtoReflect().Descriptor()
		d, err := files.FindDescriptorByName(md.FullName())
		if err != nil {
			t.Errorf("%s: not in upstream: %v", md.FullName(), err)
			continue
		}
		seen++
		up := d.(protoreflect.MessageDescriptor)
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			uf := up.Fields().ByNumber(f.Number())
			if f.Number() >= extensionMin && f.Number() <= extensionMax {
				if uf != nil {
					t.Errorf("%s: extension number %d is upstream's %s", f.FullName(), f.Number(), uf.Name())
				}
				continue
			}
			if uf == nil {
				t.Errorf("%s (%d): no upstream field with that number", f.FullName(), f.Number())
				continue
			}
			if got, want := describe(f), describe(uf); got != want {
				t.Errorf("%s: ours %s, upstream %s", f.FullName(), got, want)
			}
		}
	}
	total := 0
	for _, msgs := range upstream {
		total += len(msgs)
	}
	if seen != total {
		t.Errorf("checked %d messages, upstream table has %d", seen, total)
	}
}

func describe(f protoreflect.FieldDescriptor) string {
	s := fmt.Sprintf("%s=%d %s %s presence=%v", f.Name(), f.Number(), f.Cardinality(), f.Kind(), f.HasPresence())
	if f.Message() != nil {
		s += " " + string(f.Message().FullName())
	}
	if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() {
		s += " oneof " + string(o.Name())
	}
	return s
}

// TestRoundTripThroughUpstream: a message smg fills (every field) reads
// back through upstream's descriptor with every upstream field intact, and
// upstream's bytes, with fields smg does not declare, read into smg's types
// without error and without losing a declared field.
func TestRoundTripThroughUpstream(t *testing.T) {
	files := upstreamFiles(t)
	for _, m := range ours() {
		md := m.ProtoReflect().Descriptor()
		d, _ := files.FindDescriptorByName(md.FullName())
		up := d.(protoreflect.MessageDescriptor)

		// Ours -> upstream -> ours.
		mine := m.ProtoReflect().New()
		fill(mine, 0)
		b, err := proto.Marshal(mine.Interface())
		if err != nil {
			t.Fatal(err)
		}
		dyn := dynamicpb.NewMessage(up)
		if err := proto.Unmarshal(b, dyn); err != nil {
			t.Fatalf("%s: upstream cannot read ours: %v", md.FullName(), err)
		}
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			uf := up.Fields().ByNumber(f.Number())
			if uf == nil {
				continue
			}
			if !dyn.Has(uf) && mine.Has(f) {
				t.Errorf("%s: set in ours, absent upstream", f.FullName())
			}
		}
		b2, err := proto.Marshal(dyn) // keeps the extension fields as unknown bytes
		if err != nil {
			t.Fatal(err)
		}
		back := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b2, back); err != nil {
			t.Fatalf("%s: ours cannot read upstream's: %v", md.FullName(), err)
		}
		if !proto.Equal(back, mine.Interface()) {
			t.Errorf("%s: round trip through upstream changed the message", md.FullName())
		}

		// Upstream, every field set -> ours.
		full := dynamicpb.NewMessage(up)
		fill(full, 0)
		ub, err := proto.Marshal(full)
		if err != nil {
			t.Fatal(err)
		}
		got := m.ProtoReflect().New()
		if err := proto.Unmarshal(ub, got.Interface()); err != nil {
			t.Fatalf("%s: ours cannot read upstream's full message: %v", md.FullName(), err)
		}
		for i := range md.Fields().Len() {
			f := md.Fields().Get(i)
			uf := up.Fields().ByNumber(f.Number())
			if uf != nil && full.Has(uf) && !got.Has(f) {
				if o := uf.ContainingOneof(); o != nil && !o.IsSynthetic() && full.WhichOneof(o) != uf {
					continue // another member of the oneof is set
				}
				t.Errorf("%s: upstream's value lost", f.FullName())
			}
		}
	}
}

// TestExtensionsSkippedByUpstream: a KV event batch with smg's load record
// reads as a plain batch upstream (the record in unknown fields), and a plain
// upstream batch reads in smg with no load record (the "older servicer" case).
func TestExtensionsSkippedByUpstream(t *testing.T) {
	files := upstreamFiles(t)
	d, _ := files.FindDescriptorByName("smg.grpc.common.KvEventBatch")
	up := d.(protoreflect.MessageDescriptor)
	silence := 2.5
	b, _ := proto.Marshal(&commonpb.KvEventBatch{SequenceNumber: 7, DpRank: proto.Int32(1), Heartbeat: true,
		Load: &commonpb.PushedLoad{NumWaitingReqs: 3, EngineSilenceSeconds: &silence}})
	dyn := dynamicpb.NewMessage(up)
	if err := proto.Unmarshal(b, dyn); err != nil {
		t.Fatal(err)
	}
	if dyn.Get(up.Fields().ByName("sequence_number")).Uint() != 7 || len(dyn.GetUnknown()) == 0 {
		t.Fatalf("upstream read %v, unknown %d bytes", dyn, len(dyn.GetUnknown()))
	}
	plain := dynamicpb.NewMessage(up)
	plain.Set(up.Fields().ByName("sequence_number"), protoreflect.ValueOfUint64(9))
	pb, _ := proto.Marshal(plain)
	var got commonpb.KvEventBatch
	if err := proto.Unmarshal(pb, &got); err != nil {
		t.Fatal(err)
	}
	if got.GetSequenceNumber() != 9 || got.Load != nil || got.Heartbeat {
		t.Fatalf("plain batch read as %v", &got)
	}
	// The load record's core fields are SchedulerLoad's: the same bytes read as either.
	lb, _ := proto.Marshal(&commonpb.PushedLoad{DpRank: 1, NumRunningReqs: 2, NumWaitingReqs: 3, TokenUsage: 0.5, MaxRunningRequests: 8})
	var sl sglangpb.SchedulerLoad
	if err := proto.Unmarshal(lb, &sl); err != nil || sl.GetNumWaitingReqs() != 3 || sl.GetTokenUsage() != 0.5 || sl.GetMaxRunningRequests() != 8 {
		t.Fatalf("PushedLoad as SchedulerLoad: %v %v", &sl, err)
	}
}

// fill sets every field of m to a value that is not the default.
func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if o := f.ContainingOneof(); o != nil && !o.IsSynthetic() && o.Fields().Get(0) != f {
			continue // one member per oneof
		}
		switch {
		case f.IsMap():
			continue
		case f.IsList():
			l := m.Mutable(f).List()
			for j := range 2 {
				if f.Kind() == protoreflect.MessageKind {
					if depth < 3 {
						e := l.NewElement()
						fill(e.Message(), depth+1)
						l.Append(e)
					}
					continue
				}
				l.Append(scalar(f, j+1))
			}
		case f.Kind() == protoreflect.MessageKind:
			if depth < 3 {
				fill(m.Mutable(f).Message(), depth+1)
			}
		default:
			m.Set(f, scalar(f, 1))
		}
	}
}

func scalar(f protoreflect.FieldDescriptor, n int) protoreflect.Value {
	switch f.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(-n * int(f.Number())))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(-int64(n) << 40)
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(uint32(n * int(f.Number())))
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(uint64(n) << 40)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) + 0.25)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) * math.Pi)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", f.Name(), n))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{byte(n), 0xff})
	}
	panic(f.Kind())
}
