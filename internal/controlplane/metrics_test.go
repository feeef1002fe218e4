package controlplane

import dto "github.com/prometheus/client_model/go"

type dtoCounter struct{ dto.Metric }
