package controlplane

import "testing"

func TestPDSpecsTakeAnOptionalBootstrapPortAfterEachPrefillURL(t *testing.T) {
	specs, err := PDSpecs([]string{"http://p1:30000", "8998", "http://p2:30000"}, []string{"http://d1:30001"})
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 || specs[0].GetWorkerType() != "prefill" || specs[0].GetBootstrapPort() != 8998 ||
		specs[1].BootstrapPort != nil || specs[2].GetWorkerType() != "decode" || specs[2].GetUrl() != "http://d1:30001" {
		t.Fatalf("specs = %v", specs)
	}
	if _, err := PDSpecs([]string{"8998"}, nil); err == nil {
		t.Fatal("a port with no URL before it was accepted")
	}
	if _, err := PDSpecs([]string{"http://p1", "1", "2"}, nil); err == nil {
		t.Fatal("two ports after one URL were accepted")
	}
}
