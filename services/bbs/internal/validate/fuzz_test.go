package validate

import (
	"testing"

	"google.golang.org/protobuf/proto"

	bbsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/bbs/v1"
	modelsv1 "github.com/gavel-sched/gavel/pkg/gen/gavel/models/v1"
)

// fuzzSeeds are marshalled valid and invalid requests of the fuzzed types.
func fuzzSeeds[T proto.Message](t testing.TB, msgs ...T) [][]byte {
	t.Helper()
	out := make([][]byte, 0, len(msgs))
	for _, m := range msgs {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatalf("marshal seed: %v", err)
		}
		out = append(out, b)
	}
	return out
}

// checkRequest unmarshals data into a fresh message from newMsg (skipping undecodable input),
// validates it, and when it is accepted checks that its re-marshalled copy is accepted too.
func checkRequest(t *testing.T, data []byte, newMsg func() proto.Message) {
	v := Validator{}
	msg := newMsg()
	if err := proto.Unmarshal(data, msg); err != nil {
		t.Skip()
	}
	if err := v.Request(msg); err != nil {
		return
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		t.Fatalf("accepted request does not marshal: %v", err)
	}
	again := newMsg()
	if err := proto.Unmarshal(b, again); err != nil {
		t.Fatalf("re-marshalled request does not unmarshal: %v", err)
	}
	if err := v.Request(again); err != nil {
		t.Fatalf("accepted request is rejected after a round trip: %v\n%v", err, again)
	}
}

// FuzzValidateDesireLRP checks that validating any decodable DesireLRPRequest neither panics nor
// depends on anything but the request's content.
func FuzzValidateDesireLRP(f *testing.F) {
	deep := run("/x")
	for range 40 {
		deep = &modelsv1.Action{Kind: &modelsv1.Action_Try{Try: &modelsv1.TryAction{Action: deep}}}
	}
	bad := goodLRP()
	bad.Rootfs = "preloaded:"
	bad.Ports = []uint32{0, 8080, 8080}
	bad.Routes = map[string][]byte{"": []byte("{")}
	seeds := fuzzSeeds(f,
		&bbsv1.DesireLRPRequest{DesiredLrp: goodLRP()},
		&bbsv1.DesireLRPRequest{DesiredLrp: bad},
		&bbsv1.DesireLRPRequest{DesiredLrp: &modelsv1.DesiredLRP{ProcessGuid: "g", Domain: "d", Rootfs: "x:y", Action: deep}},
		&bbsv1.DesireLRPRequest{},
	)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRequest(t, data, func() proto.Message { return &bbsv1.DesireLRPRequest{} })
	})
}

// FuzzValidateDesireTask checks that validating any decodable DesireTaskRequest neither panics nor
// depends on anything but the request's content.
func FuzzValidateDesireTask(f *testing.F) {
	bad := goodTask()
	bad.Rootfs = "docker://"
	bad.CompletionCallbackUrl = "::"
	bad.Action = &modelsv1.Action{Kind: &modelsv1.Action_Parallel{Parallel: &modelsv1.ParallelAction{}}}
	seeds := fuzzSeeds(f,
		&bbsv1.DesireTaskRequest{TaskGuid: "task-1", Domain: "cf-tasks", Definition: goodTask()},
		&bbsv1.DesireTaskRequest{TaskGuid: "task 1", Domain: "", Definition: bad},
		&bbsv1.DesireTaskRequest{},
	)
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkRequest(t, data, func() proto.Message { return &bbsv1.DesireTaskRequest{} })
	})
}
