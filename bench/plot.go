package main

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeLatenessPlot draws lateness percentiles against the pending count
// from the lateness records: retryd's p50, p99 and max, the peers' p99,
// and the 100 ms target. Both axes are logarithmic.
func writeLatenessPlot(path string, recs []record) error {
	type key struct{ system, metric string }
	series := map[key]plotter.XYs{}
	for _, r := range recs {
		if r.Scenario != "lateness" || r.Value <= 0 {
			continue
		}
		pending, ok := r.Params["pending"]
		if !ok {
			continue
		}
		x, ok := toFloat(pending)
		if !ok || x <= 0 {
			continue
		}
		k := key{r.System, r.Metric}
		series[k] = append(series[k], plotter.XY{X: x, Y: r.Value})
	}
	if len(series) == 0 {
		return fmt.Errorf("plot: no lateness figures to draw")
	}
	p := plot.New()
	p.Title.Text = "Due lateness against pending retries (1,000/s probe)"
	p.X.Label.Text = "pending retries"
	p.Y.Label.Text = "lateness (ms)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Title.Padding = vg.Points(8)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(4)
	p.Add(plotter.NewGrid())

	lines := []struct {
		k     key
		label string
		c     color.RGBA
		dash  []vg.Length
		shape draw.GlyphDrawer
	}{
		{key{"retryd", "p50"}, "retryd p50", color.RGBA{R: 31, G: 119, B: 180, A: 255}, nil, draw.CircleGlyph{}},
		{key{"retryd", "p99"}, "retryd p99", color.RGBA{R: 31, G: 119, B: 180, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}, draw.SquareGlyph{}},
		{key{"retryd", "max"}, "retryd max", color.RGBA{R: 31, G: 119, B: 180, A: 255}, []vg.Length{vg.Points(2), vg.Points(2)}, draw.TriangleGlyph{}},
		{key{"NakWithDelay", "p99"}, "NakWithDelay p99", color.RGBA{R: 214, G: 39, B: 40, A: 255}, nil, draw.SquareGlyph{}},
		{key{"schedules", "p99"}, "message schedules p99", color.RGBA{R: 44, G: 160, B: 44, A: 255}, nil, draw.SquareGlyph{}},
	}
	minX, maxX := math.Inf(1), math.Inf(-1)
	minY, maxY := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		xys, ok := series[l.k]
		if !ok {
			continue
		}
		xys = mergeByX(xys)
		for _, xy := range xys {
			minX, maxX = min(minX, xy.X), max(maxX, xy.X)
			minY, maxY = min(minY, xy.Y), max(maxY, xy.Y)
		}
		line, points, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", l.label, err)
		}
		line.Color, line.Dashes, line.Width = l.c, l.dash, vg.Points(1.5)
		points.Color, points.Shape = l.c, l.shape
		p.Add(line, points)
		p.Legend.Add(l.label, line, points)
	}
	if !math.IsInf(minX, 1) {
		target, err := plotter.NewLine(plotter.XYs{{X: minX, Y: 100}, {X: maxX, Y: 100}})
		if err != nil {
			return fmt.Errorf("plot target: %w", err)
		}
		target.Color, target.Dashes = color.Gray{Y: 90}, []vg.Length{vg.Points(4), vg.Points(4)}
		p.Add(target)
		p.Legend.Add("target p99 100 ms", target)
		if minX == maxX {
			p.X.Min, p.X.Max = minX/2, maxX*2
		}
		// Head room above the lines for the legend.
		p.Y.Min, p.Y.Max = min(minY, 100)/2, max(maxY, 100)*40
		p.X.Tick.Marker = pendingTicks(p.X.Min, p.X.Max)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("save plot: %w", err)
	}
	return nil
}

// mergeByX sorts points by x and keeps the worst (highest) y of points
// that share an x (several runs of one size).
func mergeByX(xys plotter.XYs) plotter.XYs {
	slices.SortFunc(xys, func(a, b plotter.XY) int {
		switch {
		case a.X < b.X:
			return -1
		case a.X > b.X:
			return 1
		}
		return 0
	})
	var out plotter.XYs
	for _, xy := range xys {
		if n := len(out); n > 0 && out[n-1].X == xy.X {
			out[n-1].Y = max(out[n-1].Y, xy.Y)
			continue
		}
		out = append(out, xy)
	}
	return out
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	}
	return 0, false
}

// pendingTicks labels the powers of ten of the pending axis as 10k, 1M.
func pendingTicks(lo, hi float64) plot.ConstantTicks {
	var ticks []plot.Tick
	for v := 1.0; v <= hi*10; v *= 10 {
		if v < lo/10 {
			continue
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: count(int(v))})
	}
	return ticks
}
