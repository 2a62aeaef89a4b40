package loadgen

// A line chart as a PNG, with nothing but the standard library: the sweep
// draws the adaptive pool limit over time with it, shading the interval in
// which the upstream was slowed. Text is a 3×5 pixel font, enough for
// axis figures and short legends.

import (
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// PlotSeries is one line of a Plot.
type PlotSeries struct {
	Name   string
	Points []Point
	Color  color.RGBA
}

// Plot is a line chart of series over time.
type Plot struct {
	// Title is drawn at the top left (letters, digits and a little
	// punctuation; others show as blanks).
	Title string
	// Series are the lines.
	Series []PlotSeries
	// Shade are time intervals drawn as a grey band (a slowed upstream).
	Shade [][2]time.Duration
	// Width and Height in pixels; 0: 800×360.
	Width, Height int
}

// Colours for a few series, in order.
var PlotColors = []color.RGBA{{0x2f, 0x6f, 0xdb, 255}, {0xd6, 0x45, 0x45, 255}, {0x3f, 0xa3, 0x4d, 255}, {0xe0, 0xa0, 0x20, 255}, {0x8a, 0x4f, 0xd6, 255}}

// WritePNG draws the chart and encodes it to w.
func (p Plot) WritePNG(w io.Writer) error {
	W, H := p.Width, p.Height
	if W <= 0 || H <= 0 {
		W, H = 800, 360
	}
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	const left, right, top, bottom = 56, 16, 34, 30
	pw, ph := W-left-right, H-top-bottom
	var tmax time.Duration
	vmax := 1.0
	for _, s := range p.Series {
		for _, pt := range s.Points {
			tmax = max(tmax, pt.At)
			vmax = math.Max(vmax, pt.Value)
		}
	}
	for _, sh := range p.Shade {
		tmax = max(tmax, sh[1])
	}
	tmax = max(tmax, time.Second)
	vmax = niceCeil(vmax)
	x := func(t time.Duration) int { return left + int(float64(t)/float64(tmax)*float64(pw)) }
	y := func(v float64) int { return top + ph - int(v/vmax*float64(ph)) }
	for _, sh := range p.Shade {
		fill(img, image.Rect(x(sh[0]), top, x(sh[1]), top+ph), color.RGBA{0xe6, 0xe8, 0xee, 255})
	}
	grid, ink := color.RGBA{0xd0, 0xd4, 0xdc, 255}, color.RGBA{0x33, 0x33, 0x33, 255}
	for i := 0; i <= 4; i++ {
		v := vmax * float64(i) / 4
		hline(img, left, left+pw, y(v), grid)
		label := strconv.FormatFloat(v, 'f', -1, 64)
		text(img, left-6-textWidth(label), y(v)-5, label, ink)
	}
	step := niceCeil(tmax.Seconds() / 8)
	for s := 0.0; s <= tmax.Seconds()+1e-9; s += step {
		t := time.Duration(s * float64(time.Second))
		vline(img, x(t), top+ph, top+ph+4, ink)
		label := strconv.FormatFloat(s, 'f', -1, 64) + "s"
		text(img, x(t)-textWidth(label)/2, top+ph+8, label, ink)
	}
	hline(img, left, left+pw, top+ph, ink)
	vline(img, left, top, top+ph, ink)
	text(img, left, 8, p.Title, ink)
	lx := left + pw
	for i := len(p.Series) - 1; i >= 0; i-- {
		s := p.Series[i]
		lx -= textWidth(s.Name) + 24
		fill(img, image.Rect(lx, 22, lx+10, 30), s.Color)
		text(img, lx+14, 21, s.Name, ink)
		for j := 1; j < len(s.Points); j++ {
			a, b := s.Points[j-1], s.Points[j]
			// Steps, as a limit holds its value until the next reading.
			thickLine(img, x(a.At), y(a.Value), x(b.At), y(a.Value), s.Color)
			thickLine(img, x(b.At), y(a.Value), x(b.At), y(b.Value), s.Color)
		}
	}
	return png.Encode(w, img)
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, k := range []float64{1, 2, 2.5, 5, 10} {
		if k*p >= v-1e-9 {
			return k * p
		}
	}
	return 10 * p
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for yy := r.Min.Y; yy < r.Max.Y; yy++ {
		for xx := r.Min.X; xx < r.Max.X; xx++ {
			img.SetRGBA(xx, yy, c)
		}
	}
}

func hline(img *image.RGBA, x0, x1, y int, c color.RGBA) {
	fill(img, image.Rect(x0, y, x1+1, y+1), c)
}

func vline(img *image.RGBA, x, y0, y1 int, c color.RGBA) {
	fill(img, image.Rect(x, min(y0, y1), x+1, max(y0, y1)+1), c)
}

// thickLine draws a 2-pixel line (horizontal or vertical segments only).
func thickLine(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	fill(img, image.Rect(min(x0, x1), min(y0, y1), max(x0, x1)+2, max(y0, y1)+2), c)
}

// font is a 3×5 pixel font, drawn at twice its size.
var font = map[rune][5]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"}, '1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"}, '3': {"###", "..#", ".##", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"}, '5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"}, '7': {"###", "..#", ".#.", ".#.", ".#."},
	'8': {"###", "#.#", "###", "#.#", "###"}, '9': {"###", "#.#", "###", "..#", "###"},
	'a': {".#.", "#.#", "###", "#.#", "#.#"}, 'b': {"##.", "#.#", "##.", "#.#", "##."},
	'c': {".##", "#..", "#..", "#..", ".##"}, 'd': {"##.", "#.#", "#.#", "#.#", "##."},
	'e': {"###", "#..", "##.", "#..", "###"}, 'f': {"###", "#..", "##.", "#..", "#.."},
	'g': {".##", "#..", "#.#", "#.#", ".##"}, 'h': {"#.#", "#.#", "###", "#.#", "#.#"},
	'i': {"###", ".#.", ".#.", ".#.", "###"}, 'j': {"..#", "..#", "..#", "#.#", ".#."},
	'k': {"#.#", "#.#", "##.", "#.#", "#.#"}, 'l': {"#..", "#..", "#..", "#..", "###"},
	'm': {"#.#", "###", "###", "#.#", "#.#"}, 'n': {"##.", "#.#", "#.#", "#.#", "#.#"},
	'o': {".#.", "#.#", "#.#", "#.#", ".#."}, 'p': {"##.", "#.#", "##.", "#..", "#.."},
	'q': {".#.", "#.#", "#.#", "##.", ".##"}, 'r': {"##.", "#.#", "##.", "#.#", "#.#"},
	's': {".##", "#..", ".#.", "..#", "##."}, 't': {"###", ".#.", ".#.", ".#.", ".#."},
	'u': {"#.#", "#.#", "#.#", "#.#", "###"}, 'v': {"#.#", "#.#", "#.#", "#.#", ".#."},
	'w': {"#.#", "#.#", "###", "###", "#.#"}, 'x': {"#.#", "#.#", ".#.", "#.#", "#.#"},
	'y': {"#.#", "#.#", ".#.", ".#.", ".#."}, 'z': {"###", "..#", ".#.", "#..", "###"},
	'.': {"...", "...", "...", "...", ".#."}, ',': {"...", "...", "...", ".#.", "#.."},
	'-': {"...", "...", "###", "...", "..."}, '=': {"...", "###", "...", "###", "..."},
	':': {"...", ".#.", "...", ".#.", "..."}, '/': {"..#", "..#", ".#.", "#..", "#.."},
	'(': {".#.", "#..", "#..", "#..", ".#."}, ')': {".#.", "..#", "..#", "..#", ".#."},
	'%': {"#.#", "..#", ".#.", "#..", "#.#"}, '+': {"...", ".#.", "###", ".#.", "..."},
	'×': {"...", "#.#", ".#.", "#.#", "..."},
}

const glyphW = 8 // 3 pixels at scale 2, and a 2-pixel gap

func textWidth(s string) int { return len([]rune(s)) * glyphW }

// text draws s with its top left at (x, y).
func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for i, r := range []rune(strings.ToLower(s)) {
		g, ok := font[r]
		if !ok {
			continue
		}
		for row, bits := range g {
			for col, b := range bits {
				if b == '#' {
					fill(img, image.Rect(x+i*glyphW+col*2, y+row*2, x+i*glyphW+col*2+2, y+row*2+2), c)
				}
			}
		}
	}
}
