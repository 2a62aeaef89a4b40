package loadgen

import (
	"bytes"
	"image/png"
	"testing"
	"time"
)

// The plot is a decodable PNG whose line, shade and background are where
// the data says.
func TestPlotWritePNG(t *testing.T) {
	var pts []Point
	for i := range 21 {
		v := 40.0
		if i >= 8 && i < 14 {
			v = 10
		}
		pts = append(pts, Point{At: time.Duration(i) * 500 * time.Millisecond, Value: v})
	}
	p := Plot{Title: "limit, 100 clients", Series: []PlotSeries{{Name: "auto", Points: pts, Color: PlotColors[0]}},
		Shade: [][2]time.Duration{{4 * time.Second, 7 * time.Second}}}
	var buf bytes.Buffer
	if err := p.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() != 360 {
		t.Fatalf("size %v", b)
	}
	// Plot area: x 56..784 over 0..10 s, y 34..330 over 0..50 (40 → 93, 10 → 271).
	x := func(s float64) int { return 56 + int(s/10*728) }
	yAt := func(v float64) int { return 34 + 296 - int(v/50*296) }
	is := func(px, py int, r, g, b uint32) bool {
		cr, cg, cb, _ := img.At(px, py).RGBA()
		return cr>>8 == r && cg>>8 == g && cb>>8 == b
	}
	if !is(x(1), yAt(40), 0x2f, 0x6f, 0xdb) {
		t.Error("no line at 40 before the slowdown")
	}
	if !is(x(5.5), yAt(10), 0x2f, 0x6f, 0xdb) {
		t.Error("no line at 10 during the slowdown")
	}
	if !is(x(5.5), 200, 0xe6, 0xe8, 0xee) {
		t.Error("no shade during the slowdown")
	}
	if !is(x(2), 200, 255, 255, 255) {
		t.Error("shade outside the slowdown")
	}
}
