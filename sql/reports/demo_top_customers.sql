-- report: demo_top_customers
-- description: the customers with the highest paid revenue, written as a Delta report table
-- target: reports.demo_top_customers
-- sink: delta
-- schedule: @hourly
-- param: top_n int = 10
WITH paid AS (
    SELECT customer, sum(amount) AS revenue, count(*) AS orders
    FROM demo_orders
    WHERE status = 'paid'
    GROUP BY customer
)
SELECT customer, revenue, orders
FROM paid
ORDER BY revenue DESC, customer
LIMIT :top_n
