package backend

import (
	"fmt"
	"net/http"

	"hermeshost/sartiq"
)

// listProducts reads an organization's catalogue (a job token reads only its own org).
func (h *Handler) listProducts(w http.ResponseWriter, r *http.Request, c *call) error {
	limit, err := queryInt(r, "limit", 500, 500)
	if err != nil {
		return err
	}
	rows, err := h.db.Query(r.Context(), `
		SELECT id::text, organization_id, sku, name, description, attributes, created_at
		FROM products WHERE organization_id = $1 ORDER BY sku LIMIT $2`, c.org, limit)
	if err != nil {
		return fmt.Errorf("list products of %s: %w", c.org, err)
	}
	defer rows.Close()
	list := sartiq.ProductList{Products: []sartiq.Product{}}
	for rows.Next() {
		var p sartiq.Product
		var attrs []byte
		if err := rows.Scan(&p.ID, &p.OrganizationID, &p.SKU, &p.Name, &p.Description, &attrs, &p.CreatedAt); err != nil {
			return fmt.Errorf("list products of %s: %w", c.org, err)
		}
		p.Attributes = attrs
		list.Products = append(list.Products, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list products of %s: %w", c.org, err)
	}
	return writeJSON(w, http.StatusOK, list)
}
